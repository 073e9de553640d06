//! Held ports: while an actor is suspended, the shim holds its listening TCP
//! ports in the pod's network namespace. The first real connection resumes
//! the actor and is handed over to it; so is every connection that arrives
//! during the resume. Kubelet-style probes do not wake the actor and do not
//! fail: a bare TCP connect is accepted and closed, an HTTP GET with
//! `User-Agent: kube-probe/…` is answered `200 ok`.
//!
//! Handover: the held connections are proxied to the restored process over
//! the pod's loopback (the actor sees the shim as the peer). While the
//! listeners are closed and the process is being restored, new SYNs to those
//! ports are dropped (not refused) by an iptables rule in the pod's network
//! namespace, so a client racing the resume retransmits and is served.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{debug, info, warn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, IoContext, Result};
use crate::system::netns::{in_netns, iptables_in};

/// How long a new connection may stay silent before it counts as real
/// traffic (a server-speaks-first client). A TCP probe closes sooner.
const PROBE_WINDOW: Duration = Duration::from_millis(100);

/// Drop (not refuse) new connections to `ports` while the actor is being
/// restored.
async fn syn_drop(netns: &Path, ports: &[u16], insert: bool) -> Result<()> {
    let list = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
    let op = if insert { "-I" } else { "-D" };
    let out = iptables_in(
        netns,
        "iptables",
        // Not on loopback: the shim's own proxy connects to the actor that way.
        &[op, "INPUT", "!", "-i", "lo", "-p", "tcp", "--syn", "-m", "multiport", "--dports", &list, "-j", "DROP"],
    )
    .await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "iptables {op} in {netns:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// A connection held for the actor, with the bytes already read from it.
struct Held {
    stream: TcpStream,
    port: u16,
    head: Vec<u8>,
}

/// Listeners armed for one suspended actor.
pub struct Armed {
    netns: PathBuf,
    ports: Vec<u16>,
    stop: Option<oneshot::Sender<oneshot::Sender<Vec<Held>>>>,
}

impl Armed {
    /// Binds `ports` in `netns` and starts watching them. The first real
    /// connection sends one message on `wake`.
    pub fn arm(netns: &Path, ports: Vec<u16>, wake: mpsc::UnboundedSender<()>) -> Result<Armed> {
        let bind_ports = ports.clone();
        let std_listeners = in_netns(netns, move || {
            bind_ports
                .iter()
                .map(|p| {
                    let l = StdListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), *p))?;
                    l.set_nonblocking(true)?;
                    Ok(l)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })?;
        let listeners = std_listeners
            .into_iter()
            .map(TcpListener::from_std)
            .collect::<std::io::Result<Vec<_>>>()
            .io_context(|| "register activation listeners".into())?;
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(watch(listeners, wake, stop_rx));
        info!(ports = ?ports, "activation armed");
        Ok(Armed {
            netns: netns.to_path_buf(),
            ports,
            stop: Some(stop_tx),
        })
    }

    /// Before the restore: new SYNs are dropped, the listeners closed, and
    /// every connection accepted so far is kept for the handover.
    pub async fn begin_handover(mut self) -> Handover {
        if let Err(e) = syn_drop(&self.netns, &self.ports, true).await {
            warn!("activation: cannot hold new connections during the resume: {e}");
        }
        let mut held = Vec::new();
        if let Some(stop) = self.stop.take() {
            let (tx, rx) = oneshot::channel();
            if stop.send(tx).is_ok() {
                held = rx.await.unwrap_or_default();
            }
        }
        Handover {
            netns: self.netns.clone(),
            ports: self.ports.clone(),
            held,
        }
    }
}

/// Connections waiting for the restored actor.
pub struct Handover {
    netns: PathBuf,
    ports: Vec<u16>,
    held: Vec<Held>,
}

impl Handover {
    /// After the restore (or a failed one): new connections flow again, and
    /// the held ones are proxied to the actor.
    pub async fn finish(self) {
        // Serve the held connections first; new ones wait for the rule to go.
        let n = self.held.len();
        for h in self.held {
            let netns = self.netns.clone();
            tokio::spawn(async move {
                if let Err(e) = proxy(&netns, h).await {
                    debug!("activation proxy: {e}");
                }
            });
        }
        if let Err(e) = syn_drop(&self.netns, &self.ports, false).await {
            warn!("activation: remove the SYN drop rule: {e}");
        }
        if n > 0 {
            info!(connections = n, "activation: connections handed over");
        }
    }
}

async fn proxy(netns: &Path, mut h: Held) -> Result<()> {
    let port = h.port;
    let upstream = in_netns(netns, move || StdStream::connect((Ipv4Addr::LOCALHOST, port)))?;
    upstream.set_nonblocking(true).io_context(|| "nonblocking".into())?;
    let mut upstream = TcpStream::from_std(upstream).io_context(|| "register upstream".into())?;
    upstream.write_all(&h.head).await.io_context(|| "forward first bytes".into())?;
    tokio::io::copy_bidirectional(&mut h.stream, &mut upstream)
        .await
        .io_context(|| "proxy".into())?;
    Ok(())
}

/// Accepts on all listeners until told to stop; classifies each connection.
async fn watch(
    listeners: Vec<TcpListener>,
    wake: mpsc::UnboundedSender<()>,
    mut stop: oneshot::Receiver<oneshot::Sender<Vec<Held>>>,
) {
    // One message per accepted connection: Some (hand over) or None (a probe).
    let (held_tx, mut held_rx) = mpsc::unbounded_channel::<Option<Held>>();
    let (acc_tx, mut acc_rx) = mpsc::unbounded_channel::<(TcpStream, u16)>();
    let mut accept_tasks = Vec::new();
    for l in listeners {
        let tx = acc_tx.clone();
        accept_tasks.push(tokio::spawn(async move {
            let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
            while let Ok((s, _)) = l.accept().await {
                if tx.send((s, port)).is_err() {
                    break;
                }
            }
        }));
    }
    let mut pending = 0usize;
    let mut held = Vec::new();
    loop {
        tokio::select! {
            Some((s, port)) = acc_rx.recv() => {
                pending += 1;
                let (tx, wake) = (held_tx.clone(), wake.clone());
                tokio::spawn(async move {
                    let h = classify(s, port).await;
                    if h.is_some() {
                        let _ = wake.send(());
                    }
                    let _ = tx.send(h);
                });
            }
            Some(h) = held_rx.recv() => {
                pending -= 1;
                held.extend(h);
            }
            reply = &mut stop => {
                for t in &accept_tasks { t.abort(); }
                // Wait for connections still being classified: they are real
                // traffic too (or probes, answered meanwhile).
                while pending > 0 {
                    match held_rx.recv().await {
                        Some(h) => { pending -= 1; held.extend(h); }
                        None => break,
                    }
                }
                // Connections the kernel completed but nobody accepted yet.
                while let Ok((s, port)) = acc_rx.try_recv() { held.push(Held { stream: s, port, head: Vec::new() }); }
                if let Ok(reply) = reply { let _ = reply.send(held); }
                return;
            }
        }
    }
}

/// `Some` for real traffic (to hand over), `None` for a probe (answered here).
async fn classify(mut s: TcpStream, port: u16) -> Option<Held> {
    let mut head = vec![0u8; 4096];
    match tokio::time::timeout(PROBE_WINDOW, s.read(&mut head)).await {
        Ok(Ok(0)) => None, // TCP connect probe: connected and closed
        Ok(Ok(n)) => {
            head.truncate(n);
            if is_kube_probe(&head) {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                    .await;
                None
            } else {
                Some(Held { stream: s, port, head })
            }
        }
        Ok(Err(_)) => None,
        // Silent: a client waiting for the server to speak first.
        Err(_) => Some(Held { stream: s, port, head: Vec::new() }),
    }
}

fn is_kube_probe(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.starts_with("get ") && text.lines().any(|l| l.starts_with("user-agent: kube-probe/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_kube_probes() {
        assert!(is_kube_probe(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.31\r\n\r\n"));
        assert!(!is_kube_probe(b"GET /inc HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n"));
        assert!(!is_kube_probe(b"inc\n"));
    }
}
