//! The TCP connections of a sleeping actor. A suspend checkpoints the
//! actor's established connections (CRIU's `tcp-established`) and its
//! sockets leave the kernel silently, in repair mode. A packet the peer
//! sends meanwhile (the next request on a kept-alive connection, a
//! keepalive, a FIN) would meet no socket, and the pod's kernel would
//! answer with a reset: the connection would be lost, although the actor
//! comes back with it.
//!
//! So, while the actor sleeps, the pod's network namespace drops (never
//! resets) the packets of those connections, by their exact addresses and
//! ports, and logs them to an NFLOG group the shim listens on: the first
//! one wakes the actor, and the peer's retransmission reaches the restored
//! socket. The rules go in before the dump's network lock is lifted and
//! stay through the restore (a restore runs without a lock), and come out
//! after it, off the resume's path.
//!
//! Rules: a `TORPOR-SLEEPING` chain, jumped to first from `INPUT`, in each
//! family that has such connections; one rule per connection goes to
//! `TORPOR-WAKE`, which logs (`NFLOG`, group [`NFLOG_GROUP`]) a packet that
//! may carry data (not a bare FIN, nor a reset) and drops them all.
//! A pod has one shim, so one group per namespace.

use std::path::Path;

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{config_request, ConfigCmd, ConfigMode, ULogMessage};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket as NetlinkSocket};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::system::netns::{self, in_netns, restore_tools, xtables_restore, TcpConnection};

/// The NFLOG group the rules log to, in the pod's network namespace.
pub const NFLOG_GROUP: u16 = 0x7470;
const CHAIN: &str = "TORPOR-SLEEPING";
const WAKE_CHAIN: &str = "TORPOR-WAKE";
/// Connections kept at most per actor; the others are reset by the kernel
/// as before (an idle actor has few: this bounds the rules).
pub const MAX_KEPT: usize = 4096;

/// The `iptables-restore` input that puts the rules for `conns` of one
/// family in (`v6`: IPv6), or `None` when that family has none.
fn rules(conns: &[TcpConnection], v6: bool) -> Option<String> {
    let mine: Vec<&TcpConnection> = conns.iter().filter(|c| c.local.is_ipv6() == v6 && c.remote.is_ipv6() == v6).collect();
    if mine.is_empty() {
        return None;
    }
    let mut r = format!("*filter\n:{CHAIN} - [0:0]\n:{WAKE_CHAIN} - [0:0]\n-I INPUT -j {CHAIN}\n");
    // A peer that only closes (a FIN without data: a probe or a client
    // that connected just before the suspend and hung up) or resets does
    // not wake the actor; its packet is dropped all the same. A FIN longer
    // than the largest IP and TCP headers carries data, and wakes.
    let log = format!("-j NFLOG --nflog-group {NFLOG_GROUP} --nflog-threshold 1");
    let min_data = if v6 { 40 + 60 + 1 } else { 20 + 60 + 1 };
    r.push_str(&format!("-A {WAKE_CHAIN} -p tcp --tcp-flags FIN,RST NONE {log}\n"));
    r.push_str(&format!("-A {WAKE_CHAIN} -p tcp --tcp-flags FIN,RST FIN -m length --length {min_data}:65535 {log}\n"));
    r.push_str(&format!("-A {WAKE_CHAIN} -j DROP\n"));
    for c in mine {
        r.push_str(&format!(
            "-A {CHAIN} -p tcp -s {} --sport {} -d {} --dport {} -j {WAKE_CHAIN}\n",
            c.remote.ip(),
            c.remote.port(),
            c.local.ip(),
            c.local.port()
        ));
    }
    r.push_str("COMMIT\n");
    Some(r)
}

/// The input that takes them out again.
const REMOVAL: &str =
    "*filter\n-D INPUT -j TORPOR-SLEEPING\n-F TORPOR-SLEEPING\n-X TORPOR-SLEEPING\n-F TORPOR-WAKE\n-X TORPOR-WAKE\nCOMMIT\n";

/// Puts the rules for `conns` (at most [`MAX_KEPT`]) in the network
/// namespace `netns`; the xtables tools of the families that got rules,
/// for [`release`]. The caller has checked that none are in. A failure may
/// leave a family's rules in: the caller releases them all
/// ([`restore_tools`]).
pub async fn keep(netns: &Path, conns: &[TcpConnection]) -> Result<Vec<&'static str>> {
    let conns = if conns.len() > MAX_KEPT {
        warn!(
            connections = conns.len(),
            kept = MAX_KEPT,
            "the sleeping actor has more connections than are kept; the rest are reset if their peers send"
        );
        &conns[..MAX_KEPT]
    } else {
        conns
    };
    let mut used = Vec::new();
    for &tool in restore_tools() {
        if let Some(r) = rules(conns, tool.starts_with("ip6")) {
            xtables_restore(netns, tool, &r, "keep the sleeping actor's connections").await?;
            used.push(tool);
        }
    }
    info!(connections = conns.len(), "the sleeping actor's connections are kept");
    Ok(used)
}

/// Takes the rules out of `netns`, with each of `tools` (`iptables-restore`,
/// `ip6tables-restore`: both families at once). A family without them is fine.
pub async fn release(netns: &Path, tools: &[&str]) -> Result<()> {
    let remove = |tool: &'static str| async move {
        match tools.contains(&tool) {
            true => xtables_restore(netns, tool, REMOVAL, "release the sleeping actor's connections").await,
            false => Ok(()),
        }
    };
    let (v4, v6) = tokio::join!(remove("iptables-restore"), remove("ip6tables-restore"));
    netns::removal_outcome([v4, v6])
}

/// The shim's watch of the NFLOG group in the pod's network namespace: a
/// packet of a kept connection sends one message on `wake`. Ends when
/// dropped (its socket is closed, the group unbound).
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// Binds [`NFLOG_GROUP`] in `netns` (a netlink socket keeps the
    /// namespace it was made in) and starts watching it.
    pub fn start(netns: &Path, wake: mpsc::UnboundedSender<()>) -> Result<Watch> {
        let socket = in_netns(netns, || bind_nflog_group(NFLOG_GROUP))?;
        // SAFETY: the netlink socket owns its fd, which stays open and the
        // same until the socket is dropped with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE) }
            .map_err(|e| Error::Io { context: "watch the NFLOG group".into(), source: e.into_parts().1 })?;
        let task = tokio::spawn(async move {
            let mut buf = Vec::with_capacity(64 * 1024);
            loop {
                let mut ready = match fd.readable().await {
                    Ok(r) => r,
                    Err(e) => {
                        warn!("the watch of the sleeping actor's connections ends: {e}");
                        return;
                    }
                };
                buf.clear();
                match ready.try_io(|s| s.get_ref().recv(&mut buf, 0)) {
                    Ok(Ok(n)) => {
                        if has_packet(&buf[..n]) {
                            debug!("a packet of a kept connection: wake");
                            if wake.send(()).is_err() {
                                return;
                            }
                        }
                    }
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        // Messages were lost: some packet came.
                        if wake.send(()).is_err() {
                            return;
                        }
                    }
                    Ok(Err(e)) => {
                        warn!("the watch of the sleeping actor's connections ends: {e}");
                        return;
                    }
                    Err(_would_block) => continue,
                }
            }
        });
        Ok(Watch { task })
    }
}

/// A non-blocking NFLOG socket bound to `group`, metadata only, each
/// packet sent at once; the kernel's acknowledgement checked. Run it in the
/// pod's netns (NFLOG groups are per namespace). Also the idle policy's
/// (`system::activity`).
pub(crate) fn bind_nflog_group(group: u16) -> std::io::Result<NetlinkSocket> {
    let mut socket = NetlinkSocket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let request = config_request(
        NetfilterProtoFamily::Unspec,
        group,
        vec![ConfigCmd::Bind.into(), ConfigMode::META.into(), netlink_packet_netfilter::nflog::ConfigNla::QThresh(1)],
    );
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut answer = Vec::with_capacity(4096);
    socket.recv(&mut answer, 0)?;
    let msg = <NetlinkMessage<NetfilterMessage>>::deserialize(&answer)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("NFLOG bind answer: {e}")))?;
    if let NetlinkPayload::Error(e) = msg.payload {
        if let Some(code) = e.code {
            return Err(std::io::Error::from_raw_os_error(-code.get()));
        }
    }
    socket.set_non_blocking(true)?;
    Ok(socket)
}

/// Whether a batch of netlink messages holds a logged packet.
fn has_packet(mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        let Ok(msg) = <NetlinkMessage<NetfilterMessage>>::deserialize(bytes) else { return false };
        if let NetlinkPayload::InnerMessage(NetfilterMessage { inner: NetfilterMessageInner::ULog(ULogMessage::Packet(_)), .. }) =
            msg.payload
        {
            return true;
        }
        let len = msg.header.length as usize;
        if len == 0 || len > bytes.len() {
            return false;
        }
        bytes = &bytes[len..];
    }
    false
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use super::*;
    use crate::system::netns::tests::TestNetns;

    fn conn(local: &str, remote: &str) -> TcpConnection {
        TcpConnection { local: local.parse().unwrap(), remote: remote.parse().unwrap() }
    }

    #[test]
    fn rules_match_each_connection_from_its_peer_by_family() {
        let conns = [conn("10.0.0.2:8080", "10.0.0.1:40000"), conn("[fd00::2]:8080", "[fd00::1]:40001")];
        let v4 = rules(&conns, false).unwrap();
        assert!(v4.contains("-A TORPOR-SLEEPING -p tcp -s 10.0.0.1 --sport 40000 -d 10.0.0.2 --dport 8080 -j TORPOR-WAKE"), "{v4}");
        assert!(!v4.contains("fd00"), "{v4}");
        assert!(v4.contains(&format!("-A TORPOR-WAKE -p tcp --tcp-flags FIN,RST NONE -j NFLOG --nflog-group {NFLOG_GROUP}")), "{v4}");
        assert!(v4.contains("--tcp-flags FIN,RST FIN -m length --length 81:65535 -j NFLOG"), "a FIN wakes only with data: {v4}");
        assert!(v4.contains("-A TORPOR-WAKE -j DROP\n"), "{v4}");
        assert!(v4.contains("-I INPUT -j TORPOR-SLEEPING"), "{v4}");
        let v6 = rules(&conns, true).unwrap();
        assert!(v6.contains("-s fd00::1 --sport 40001 -d fd00::2 --dport 8080"), "{v6}");
        assert!(rules(&conns[..1], true).is_none(), "no IPv6 connection: no IPv6 rules");
    }

    /// Closes `s` without a FIN or a reset, as a checkpointed socket
    /// leaves the kernel (TCP repair mode).
    fn vanish(s: TcpStream) {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt(2) on our socket with an int that lives for the call.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_REPAIR,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "TCP_REPAIR: {}", std::io::Error::last_os_error());
        drop(s);
    }

    /// A loopback connection made in the netns at `path`: (client, server).
    fn connected(path: &std::path::Path) -> (TcpStream, TcpStream) {
        in_netns(path, || {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let c = TcpStream::connect(l.local_addr()?)?;
            let (s, _) = l.accept()?;
            Ok((c, s))
        })
        .unwrap()
    }

    /// The error a read ends with, through signals (the reaper's SIGCHLD of
    /// other tests' children interrupts a blocking read).
    fn read_err(c: &mut std::net::TcpStream, b: &mut [u8]) -> std::io::Error {
        loop {
            match c.read(b) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return e,
                Ok(n) => panic!("read {n} bytes, expected an error"),
            }
        }
    }

    /// In a private netns: a connection whose server end vanished as in a
    /// checkpoint. Kept, the client's next bytes are dropped (no reset)
    /// and wake the watcher; released, they are reset as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_connection_is_never_reset_and_its_packets_wake() {
        let ns = TestNetns::new();
        let path = ns.path.clone();
        let (client, server) = connected(&path);
        let kept = conn(&server.local_addr().unwrap().to_string(), &server.peer_addr().unwrap().to_string());
        assert_eq!(crate::system::netns::open_connections(ns.tid).iter().filter(|c| **c == kept).count(), 1, "the server end is listed");
        vanish(server);

        // A second such connection whose client only hangs up (a bare FIN).
        let (closer, gone) = connected(&path);
        let closing = conn(&gone.local_addr().unwrap().to_string(), &gone.peer_addr().unwrap().to_string());
        vanish(gone);

        let (tx, mut rx) = mpsc::unbounded_channel();
        let watch = Watch::start(&path, tx).unwrap();
        assert_eq!(keep(&path, &[kept, closing]).await.unwrap(), ["iptables-restore"]);
        closer.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(500), rx.recv()).await.is_err(), "a bare FIN does not wake the actor");
        let mut c = client.try_clone().unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        c.write_all(b"get\n").unwrap();
        tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("a wake from the kept connection's packet").unwrap();
        let mut b = [0u8; 1];
        let e = read_err(&mut c, &mut b);
        assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "dropped, not reset: {e}");

        release(&path, &["iptables-restore"]).await.unwrap();
        drop(watch);
        // Without the rules, the retransmission meets no socket: a reset.
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let e = read_err(&mut c, &mut b);
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
        // Released twice, in both families: nothing to take out is fine.
        release(&path, restore_tools()).await.unwrap();
    }
}
