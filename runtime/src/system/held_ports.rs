//! Held ports: while an actor is suspended, the shim holds its listening TCP
//! sockets in the pod's network namespace, on the address each was bound to
//! (a socket the actor bound to `127.0.0.1` or `::1` is held on loopback
//! only, never exposed on the pod's IP; `0.0.0.0` and `::` stay wildcards;
//! IPv6 as IPv4). The first real connection resumes the actor and is
//! handed over to it; so is every connection that arrives during the
//! resume. Kubelet-style probes do not wake the actor and do not fail: a
//! bare TCP connect is accepted and closed, an HTTP GET with `User-Agent:
//! kube-probe/…` is answered `200 ok`.
//!
//! Handover: the held connections are proxied to the restored process,
//! connected from inside the pod's network namespace to the address the
//! actor listens on (its loopback for a wildcard listener). So the actor
//! sees the shim as the peer: a handed-over connection comes from the
//! pod's own address (`127.0.0.1`/`::1` for a wildcard or loopback
//! listener), not from the remote client; an app that trusts local peers
//! must not trust it for connections that arrive while it sleeps (handing
//! the original socket over instead is future work). While the listeners
//! are closed and the process is being restored, new SYNs to those ports
//! are dropped (not refused), so a client racing the resume retransmits and
//! is served: a pair of iptables (and, for IPv6 listeners, ip6tables) rules
//! in the pod's network namespace drops a SYN to a held port only when no
//! socket listens on it (`-m socket --nowildcard` accepts it first). The
//! pair goes in when the ports are held and comes out [`KEEP_RULES`] after
//! the handover, both in the background: no iptables run on the resume's
//! path (they cost it two process spawns, 15-40 ms), nor beside it while
//! other actors of the node wake at the same time (each removal is one
//! `iptables-restore` and one `ip6tables-restore`). A suspend within that
//! time holds the same ports with the pair still in, and takes it over
//! instead of inserting another. Meanwhile the restored listeners take
//! their SYNs (the pair drops a SYN only when nothing listens): only an
//! actor that closes a held port in the seconds after its resume sees a
//! new connection to it dropped (retransmitted) instead of refused. Rule
//! changes are serialized, and the handover waits for the pair to be in.
//!
//! Bounds: at most [`MAX_HELD`] connections are held (or being classified)
//! at a time; one over the bound is reset at once (RST) with a warning. An
//! accept error (EMFILE, ENFILE, ENOBUFS...) does not end a listener: it
//! backs off and accepts again.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{debug, info, warn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, IoContext, Result};
use crate::system::netns::{connect_in, in_netns, listening_ports, remove_rules_later, xtables_restore};

/// How long a new connection may stay silent before it counts as real
/// traffic (a server-speaks-first client). A TCP probe closes sooner.
const PROBE_WINDOW: Duration = Duration::from_millis(100);
/// Connections held (or being classified) at most, for one actor; more are
/// reset. Each costs the shim a socket and up to 4 KiB.
pub const MAX_HELD: usize = 512;
/// An accept error backs off this long at first, doubling up to
/// [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A handed-over connection's connect to the restored actor.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// `-m multiport` takes at most 15 ports per rule.
const MULTIPORT_MAX: usize = 15;
/// How long a port found in use is bound again before it counts as taken.
/// A listener just closed (the shim's own at a handover, a dumped actor's)
/// stays open in any child forked at that moment until its exec closes it:
/// the shim forks runc, CRIU and iptables from other threads.
const BIND_IN_USE_RETRY: Duration = Duration::from_millis(200);
/// What a failed removal of the SYN-drop rules is logged as.
const REMOVE_SYN_DROP: &str = "activation: remove the SYN drop rules";

/// What to hold for an actor: the sockets it listens on (`pid`, in the
/// pod's network namespace), or, with `torpor.dev/activate-on`, the
/// declared ports: each on the addresses the actor listens on it, or on
/// `0.0.0.0` when it listens on it nowhere now. Sorted, no duplicates.
pub fn listeners_for(pid: Option<i32>, declared: Option<&[u16]>) -> Vec<SocketAddr> {
    let live = pid.map(listening_ports).unwrap_or_default();
    let mut out: Vec<SocketAddr> = match declared {
        None => live,
        Some(ports) => ports
            .iter()
            .flat_map(|&p| {
                let on: Vec<SocketAddr> = live.iter().filter(|a| a.port() == p).copied().collect();
                if on.is_empty() {
                    vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p)]
                } else {
                    on
                }
            })
            .collect(),
    };
    out.sort_unstable();
    out.dedup();
    out
}

/// Where a handed-over connection to listener `listen` is proxied: the
/// same address, or the loopback of its family for a wildcard.
fn upstream_of(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(a) if a.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port()),
        IpAddr::V6(a) if a.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port()),
        _ => listen,
    }
}

/// The ports of `listen` whose SYNs each family's rule drops: IPv4 for
/// IPv4 listeners and `::` (a dual-stack wildcard takes IPv4 too), IPv6 for
/// IPv6 listeners.
fn syn_drop_ports(listen: &[SocketAddr]) -> [(&'static str, Vec<u16>); 2] {
    let mut v4: Vec<u16> = listen
        .iter()
        .filter(|a| a.is_ipv4() || a.ip().is_unspecified())
        .map(|a| a.port())
        .collect();
    let mut v6: Vec<u16> = listen.iter().filter(|a| a.is_ipv6()).map(|a| a.port()).collect();
    for p in [&mut v4, &mut v6] {
        p.sort_unstable();
        p.dedup();
    }
    [("iptables", v4), ("ip6tables", v6)]
}

/// Serializes the shim's changes to the SYN-drop rules (one shim serves
/// one pod). A removal is asked for only once the insert it undoes is in
/// (the hold's `rules_in`), so pairs never go before they came.
static SYN_DROP_RULES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the SYN-drop rules stay in after a handover (see the module
/// doc): their removal waits out a burst of wake-ups on the node, and a
/// suspend within it takes them over.
const KEEP_RULES: Duration = Duration::from_secs(5);

/// The SYN-drop pairs left in after a handover, by network namespace: the
/// listeners they cover, and the removal due for them (its number).
static KEPT_RULES: std::sync::Mutex<Vec<(PathBuf, Vec<SocketAddr>, u64)>> = std::sync::Mutex::new(Vec::new());

fn kept_rules() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Vec<SocketAddr>, u64)>> {
    KEPT_RULES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes over the pair left in `netns` for exactly `listen` by a handover
/// (its removal is called off): whether there was one. A pair for other
/// listeners stays, and goes when due.
fn take_kept_rules(netns: &Path, listen: &[SocketAddr]) -> bool {
    let mut kept = kept_rules();
    match kept.iter().position(|(ns, l, _)| ns == netns && l == listen) {
        Some(i) => {
            kept.swap_remove(i);
            true
        }
        None => false,
    }
}

/// Leaves the pair for `listen` in `netns` for [`KEEP_RULES`], then takes
/// it out unless a hold took it over meanwhile (or the namespace is gone).
/// Without a tokio runtime it stays, with a warning ([`remove_rules_later`]).
fn keep_rules_then_remove(netns: PathBuf, listen: Vec<SocketAddr>) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return remove_rules_later(netns, REMOVE_SYN_DROP, async {}, move |ns| async move { syn_drop(&ns, &listen, false).await });
    };
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    kept_rules().push((netns.clone(), listen.clone(), n));
    rt.spawn(async move {
        tokio::time::sleep(KEEP_RULES).await;
        let due = {
            let mut kept = kept_rules();
            let i = kept.iter().position(|(ns, _, m)| *ns == netns && *m == n);
            i.map(|i| kept.swap_remove(i)).is_some()
        };
        if due && netns.exists() {
            if let Err(e) = syn_drop(&netns, &listen, false).await {
                warn!("{REMOVE_SYN_DROP}: {e}");
            }
        }
    });
}

/// The `*-restore` input that inserts (or removes) the pairs of rules for
/// `ports`: per chunk of [`MULTIPORT_MAX`] ports, the first accepts a SYN
/// that has a listening socket, the second drops the rest; inserted at the
/// top, accept first. Not on loopback: the shim's own proxy connects to the
/// actor that way.
fn syn_drop_rules(ports: &[u16], insert: bool) -> String {
    let mut rules = String::from("*filter\n");
    for chunk in ports.chunks(MULTIPORT_MAX) {
        let list = chunk.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let syn = format!("! -i lo -p tcp --syn -m multiport --dports {list}");
        let (accept, drop) = if insert { ("-I INPUT 1", "-I INPUT 2") } else { ("-D INPUT", "-D INPUT") };
        rules.push_str(&format!("{accept} {syn} -m socket --nowildcard -j ACCEPT\n{drop} {syn} -j DROP\n"));
    }
    rules.push_str("COMMIT\n");
    rules
}

/// Inserts (or removes) the pairs of rules that drop (not refuse) a new
/// connection to a port of `listen` while nothing listens on it: one
/// transaction per family (`iptables-restore --noflush`), both at once, so
/// a pair is never half in.
async fn syn_drop(netns: &Path, listen: &[SocketAddr], insert: bool) -> Result<()> {
    let _serial = SYN_DROP_RULES.lock().await;
    let what = if insert { "drop SYNs to the held ports" } else { "stop dropping SYNs to the held ports" };
    let change = |tool: &'static str, ports: Vec<u16>| async move {
        if ports.is_empty() {
            return Ok(());
        }
        xtables_restore(netns, &format!("{tool}-restore"), &syn_drop_rules(&ports, insert), what).await
    };
    let [(t4, p4), (t6, p6)] = syn_drop_ports(listen);
    let (v4, v6) = tokio::join!(change(t4, p4), change(t6, p6));
    let errors: Vec<String> = [v4, v6].into_iter().filter_map(|r| r.err().map(|e| e.to_string())).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(errors.join("; ")))
    }
}

/// A connection held for the actor, with the bytes already read from it.
struct Held {
    stream: TcpStream,
    /// The listener it came in on.
    listen: SocketAddr,
    head: Vec<u8>,
}

/// Listeners armed for one suspended actor.
pub struct Armed {
    netns: PathBuf,
    listen: Vec<SocketAddr>,
    stop: Option<oneshot::Sender<oneshot::Sender<Vec<Held>>>>,
    /// Whether the handover drops new SYNs while it runs (the shim's own
    /// listeners close; the actor's own, while frozen, stay open).
    drop_syns: bool,
    /// Told when the SYN-drop rules asked for at the hold are in (or
    /// failed): the handover waits for it, so that their removal after it
    /// can never run before their insert.
    rules_in: Option<oneshot::Receiver<()>>,
}

/// A listening socket bound to `addr`; an IPv6 wildcard is IPv6-only when
/// `v6_only` (an IPv4 listener on the same port is held beside it).
fn bind(addr: SocketAddr, v6_only: bool) -> std::io::Result<StdListener> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new socket this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let set = |level: libc::c_int, opt: libc::c_int| {
        let one: libc::c_int = 1;
        // SAFETY: a c_int option that lives for the call.
        let rc = unsafe {
            libc::setsockopt(fd.as_raw_fd(), level, opt, (&one as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
        };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // As std's bind does: a port whose old connections linger in TIME_WAIT.
    set(libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
    if addr.is_ipv6() && v6_only {
        set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)?;
    }
    // SAFETY: bind(2) and listen(2) on our socket, with a sockaddr of the
    // socket's family that lives for the call.
    let rc = unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_in).cast(), std::mem::size_of_val(&sa) as libc::socklen_t)
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_scope_id = a.scope_id();
                libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_in6).cast(), std::mem::size_of_val(&sa) as libc::socklen_t)
            }
        }
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen(2) on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 1024) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(StdListener::from(fd))
}

/// [`bind`], again every few milliseconds for up to `retry` while the port
/// is in use (see [`BIND_IN_USE_RETRY`]); any other error at once.
fn bind_retrying(addr: SocketAddr, v6_only: bool, retry: Duration) -> std::io::Result<StdListener> {
    let deadline = std::time::Instant::now() + retry;
    loop {
        match bind(addr, v6_only) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

impl Armed {
    /// Binds `listen` (addresses and ports, from [`listeners_for`]) in
    /// `netns` and starts watching them. The first real connection sends
    /// one message on `wake`.
    pub fn arm(netns: &Path, listen: Vec<SocketAddr>, wake: mpsc::UnboundedSender<()>) -> Result<Armed> {
        Self::arm_bounded(netns, listen, wake, MAX_HELD)
    }

    fn arm_bounded(netns: &Path, listen: Vec<SocketAddr>, wake: mpsc::UnboundedSender<()>, limit: usize) -> Result<Armed> {
        let addrs = listen.clone();
        // bind(2) does not block: a short-lived thread in the namespace.
        let bound = in_netns(netns, move || {
            Ok(addrs
                .iter()
                .map(|a| {
                    let v6_only = a.is_ipv6() && addrs.iter().any(|b| b.is_ipv4() && b.port() == a.port());
                    (*a, bind_retrying(*a, v6_only, BIND_IN_USE_RETRY))
                })
                .collect::<Vec<_>>())
        })?;
        // One address that cannot be bound (a link-local one without its
        // scope...) does not cost the others their activation.
        let mut listeners = Vec::new();
        let mut listen = Vec::new();
        let mut failed = Vec::new();
        for (a, r) in bound {
            match r.and_then(TcpListener::from_std) {
                Ok(l) => {
                    listeners.push((l, a));
                    listen.push(a);
                }
                Err(e) => failed.push(format!("{a}: {e}")),
            }
        }
        if listeners.is_empty() {
            return Err(Error::InvalidArgument(format!("no activation listener in {netns:?}: {}", failed.join("; "))));
        }
        if !failed.is_empty() {
            warn!(netns = ?netns, "activation: not held: {}", failed.join("; "));
        }
        Ok(Self::watching(netns, listeners, listen, wake, limit, true))
    }

    /// Watches listening sockets the caller already has (the frozen actor's
    /// own, see [`crate::lifecycle::freeze`]; non-blocking), with the same
    /// classification: probes are answered, a real connection wakes. No
    /// SYN-drop rule at the handover (the actor's listeners stay open);
    /// every listener is closed before [`Armed::begin_handover`] returns.
    pub fn arm_listeners(netns: &Path, listeners: Vec<(StdListener, SocketAddr)>, wake: mpsc::UnboundedSender<()>) -> Result<Armed> {
        let mut tokio_listeners = Vec::new();
        let mut listen = Vec::new();
        for (l, a) in listeners {
            let l = TcpListener::from_std(l).io_context(|| format!("watch the listener on {a}"))?;
            tokio_listeners.push((l, a));
            listen.push(a);
        }
        Ok(Self::watching(netns, tokio_listeners, listen, wake, MAX_HELD, false))
    }

    fn watching(netns: &Path, listeners: Vec<(TcpListener, SocketAddr)>, listen: Vec<SocketAddr>, wake: mpsc::UnboundedSender<()>, limit: usize, drop_syns: bool) -> Armed {
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(watch(listeners, wake, stop_rx, limit));
        let rules_in = drop_syns.then(|| {
            let (done, rules_in) = oneshot::channel();
            if take_kept_rules(netns, &listen) {
                // The pair the last handover left in covers these ports.
                let _ = done.send(());
                return rules_in;
            }
            // In the background: the handover waits for it (see the module doc).
            let (ns, ports) = (netns.to_path_buf(), listen.clone());
            tokio::spawn(async move {
                if let Err(e) = syn_drop(&ns, &ports, true).await {
                    warn!("activation: new connections will be refused, not held, while the actor resumes: {e}");
                }
                let _ = done.send(());
            });
            rules_in
        });
        info!(listen = ?listen, "activation armed");
        Armed {
            netns: netns.to_path_buf(),
            listen,
            stop: Some(stop_tx),
            drop_syns,
            rules_in,
        }
    }

    /// Nothing to wake any more (the suspended container was stopped): the
    /// listeners close, and the SYN-drop rules go once they are in (in the
    /// background; without a runtime, they stay, with a warning).
    pub fn release(mut self) {
        drop(self.stop.take());
        let Some(rules_in) = self.rules_in.take() else { return };
        let ready = async move {
            let _ = rules_in.await;
        };
        let listen = self.listen.clone();
        remove_rules_later(self.netns.clone(), REMOVE_SYN_DROP, ready, move |ns| async move { syn_drop(&ns, &listen, false).await });
    }

    /// Before the restore: new SYNs are dropped, the listeners closed, and
    /// every connection accepted so far is kept for the handover.
    pub async fn begin_handover(mut self) -> Handover {
        if let Some(rules_in) = self.rules_in.take() {
            // The SYN-drop rules asked for when the ports were held are in.
            let _ = rules_in.await;
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
            listen: self.listen.clone(),
            held,
            drop_syns: self.drop_syns,
        }
    }
}

/// Connections waiting for the restored actor.
pub struct Handover {
    netns: PathBuf,
    listen: Vec<SocketAddr>,
    held: Vec<Held>,
    drop_syns: bool,
}

impl Handover {
    /// No connection is waiting.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

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
        if self.drop_syns {
            // The restored listeners take the SYNs now; the pair goes later.
            keep_rules_then_remove(self.netns.clone(), self.listen.clone());
        }
        if n > 0 {
            info!(connections = n, "activation: connections handed over");
        }
    }
}

async fn proxy(netns: &Path, mut h: Held) -> Result<()> {
    let mut upstream = connect_in(netns, upstream_of(h.listen), CONNECT_DEADLINE).await?;
    upstream.write_all(&h.head).await.io_context(|| "forward first bytes".into())?;
    tokio::io::copy_bidirectional(&mut h.stream, &mut upstream)
        .await
        .io_context(|| "proxy".into())?;
    Ok(())
}

/// Accepts until the receiver is gone. An error (EMFILE...) backs off and
/// accepts again: a listener never ends on its own.
async fn accept_loop<T, F, Fut>(what: SocketAddr, mut accept: F, tx: mpsc::UnboundedSender<T>)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        match accept().await {
            Ok(x) => {
                backoff = ACCEPT_BACKOFF_MIN;
                if tx.send(x).is_err() {
                    return;
                }
            }
            Err(e) => {
                if backoff == ACCEPT_BACKOFF_MIN {
                    warn!(listen = %what, "activation: accept failed, retrying: {e}");
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

/// Resets `s` (RST, not FIN): a connection shed over the bound.
fn reset(s: TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a linger struct that lives for the call, on a socket we own.
    unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&linger as *const libc::linger).cast(), std::mem::size_of::<libc::linger>() as libc::socklen_t);
    }
    drop(s);
}

/// Accepts on all listeners until told to stop; classifies each connection;
/// holds at most `limit` (classified or being classified), resets the rest.
async fn watch(
    listeners: Vec<(TcpListener, SocketAddr)>,
    wake: mpsc::UnboundedSender<()>,
    mut stop: oneshot::Receiver<oneshot::Sender<Vec<Held>>>,
    limit: usize,
) {
    // One message per accepted connection: Some (hand over) or None (a probe).
    let (held_tx, mut held_rx) = mpsc::unbounded_channel::<Option<Held>>();
    let (acc_tx, mut acc_rx) = mpsc::unbounded_channel::<(TcpStream, SocketAddr)>();
    let mut accept_tasks = Vec::new();
    for (l, addr) in listeners {
        let tx = acc_tx.clone();
        accept_tasks.push(tokio::spawn(async move {
            let l = &l;
            accept_loop(addr, move || async move { l.accept().await.map(|(s, _)| (s, addr)) }, tx).await;
        }));
    }
    drop(acc_tx);
    let mut pending = 0usize;
    let mut held = Vec::new();
    let mut shed = 0u64;
    loop {
        tokio::select! {
            Some((s, listen)) = acc_rx.recv() => {
                if pending + held.len() >= limit {
                    if shed == 0 {
                        warn!(listen = %listen, limit, "activation: too many connections held for the sleeping actor; resetting new ones");
                    }
                    shed += 1;
                    reset(s);
                    continue;
                }
                pending += 1;
                let (tx, wake) = (held_tx.clone(), wake.clone());
                tokio::spawn(async move {
                    let h = classify(s, listen).await;
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
                // The listeners are closed (dropped with their tasks) before
                // the reply: a frozen actor's own ones must be, before it is
                // thawed or dumped.
                for t in accept_tasks.drain(..) { let _ = t.await; }
                // Wait for connections still being classified: they are real
                // traffic too (or probes, answered meanwhile).
                while pending > 0 {
                    match held_rx.recv().await {
                        Some(h) => { pending -= 1; held.extend(h); }
                        None => break,
                    }
                }
                // Connections the kernel completed but nobody accepted yet.
                while let Ok((s, listen)) = acc_rx.try_recv() {
                    if held.len() < limit { held.push(Held { stream: s, listen, head: Vec::new() }); } else { shed += 1; reset(s); }
                }
                if shed > 0 {
                    warn!(shed, limit, "activation: connections reset over the bound while the actor slept");
                }
                if let Ok(reply) = reply { let _ = reply.send(held); }
                return;
            }
        }
    }
}

/// `Some` for real traffic (to hand over), `None` for a probe (answered here).
async fn classify(mut s: TcpStream, listen: SocketAddr) -> Option<Held> {
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
                Some(Held { stream: s, listen, head })
            }
        }
        Ok(Err(_)) => None,
        // Silent: a client waiting for the server to speak first.
        Err(_) => Some(Held { stream: s, listen, head: Vec::new() }),
    }
}

fn is_kube_probe(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.starts_with("get ") && text.lines().any(|l| l.starts_with("user-agent: kube-probe/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::netns::tests::TestNetns;
    use crate::system::netns::iptables_in;

    #[test]
    fn recognises_kube_probes() {
        assert!(is_kube_probe(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.31\r\n\r\n"));
        assert!(!is_kube_probe(b"GET /inc HTTP/1.1\r\nUser-Agent: curl/8\r\n\r\n"));
        assert!(!is_kube_probe(b"inc\n"));
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Once every listener was bound on 0.0.0.0: a socket the actor bound
    /// to loopback was exposed on the pod's IP while it slept.
    #[tokio::test]
    async fn listeners_are_held_on_the_address_the_actor_bound() {
        let ns = TestNetns::new();
        let listen = vec![addr("127.0.0.1:6060"), addr("0.0.0.0:8080"), addr("[::1]:6061"), addr("[::]:8081"), addr("0.0.0.0:8082"), addr("[::]:8082")];
        let (wake, _rx) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, listen.clone(), wake).unwrap();
        let mut want = listen.clone();
        want.sort_unstable();
        assert_eq!(listening_ports(ns.tid), want);
        drop(armed);
    }

    /// An address that cannot be bound costs only itself.
    #[tokio::test]
    async fn an_unbindable_address_does_not_cost_the_others() {
        let ns = TestNetns::new();
        let (wake, _rx) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![addr("127.0.0.1:6062"), addr("10.9.9.9:6063")], wake.clone()).unwrap();
        assert_eq!(armed.listen, vec![addr("127.0.0.1:6062")]);
        assert_eq!(listening_ports(ns.tid), vec![addr("127.0.0.1:6062")]);
        drop(armed);
        let e = Armed::arm(&ns.path, vec![addr("10.9.9.9:6063")], wake).err().expect("nothing bound");
        assert!(e.to_string().contains("10.9.9.9:6063"), "{e}");
    }

    #[test]
    fn declared_ports_use_the_actor_s_addresses() {
        // No pid: each declared port on the IPv4 wildcard.
        assert_eq!(listeners_for(None, Some(&[9090, 80])), vec![addr("0.0.0.0:80"), addr("0.0.0.0:9090")]);
        let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = lo.local_addr().unwrap().port();
        let got = listeners_for(Some(std::process::id() as i32), Some(&[port]));
        assert_eq!(got, vec![lo.local_addr().unwrap()]);
        assert_eq!(upstream_of(addr("0.0.0.0:80")), addr("127.0.0.1:80"));
        assert_eq!(upstream_of(addr("[::]:80")), addr("[::1]:80"));
        assert_eq!(upstream_of(addr("10.1.2.3:80")), addr("10.1.2.3:80"));
    }

    #[test]
    fn syn_drop_rules_are_one_transaction() {
        let ports: Vec<u16> = (1..=16).collect();
        let list: Vec<String> = (1..=15).map(|p| p.to_string()).collect();
        let syn = format!("! -i lo -p tcp --syn -m multiport --dports {}", list.join(","));
        assert_eq!(
            syn_drop_rules(&ports, true),
            format!(
                "*filter\n-I INPUT 1 {syn} -m socket --nowildcard -j ACCEPT\n-I INPUT 2 {syn} -j DROP\n\
                 -I INPUT 1 ! -i lo -p tcp --syn -m multiport --dports 16 -m socket --nowildcard -j ACCEPT\n\
                 -I INPUT 2 ! -i lo -p tcp --syn -m multiport --dports 16 -j DROP\nCOMMIT\n"
            )
        );
        assert_eq!(
            syn_drop_rules(&[80], false),
            "*filter\n-D INPUT ! -i lo -p tcp --syn -m multiport --dports 80 -m socket --nowildcard -j ACCEPT\n\
             -D INPUT ! -i lo -p tcp --syn -m multiport --dports 80 -j DROP\nCOMMIT\n"
        );
    }

    #[test]
    fn syn_drop_rules_cover_both_families_in_chunks() {
        let listen = vec![addr("127.0.0.1:1"), addr("[::1]:2"), addr("[::]:3")];
        let [(t4, v4), (t6, v6)] = syn_drop_ports(&listen);
        assert_eq!((t4, v4), ("iptables", vec![1, 3]));
        assert_eq!((t6, v6), ("ip6tables", vec![2, 3]));
    }

    /// A connection is held, the SYN-drop rule goes in for IPv6 too, and the
    /// connection is handed over to the actor listening on `::1` again.
    #[tokio::test]
    async fn an_ipv6_connection_is_held_and_handed_over() {
        let ns = TestNetns::new();
        let listen = addr("[::1]:7070");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![listen], wake).unwrap();
        let client = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        cw.write_all(b"hello").await.unwrap();
        woken.recv().await.unwrap();
        let handover = armed.begin_handover().await;
        let rules = iptables_in(&ns.path, "ip6tables", &["-S", "INPUT"]).await.unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert!(rules.contains("--dports 7070") && rules.contains("DROP"), "{rules}");
        assert!(rules.contains("-m socket --nowildcard -j ACCEPT"), "a SYN with a listener is accepted first: {rules}");
        // The restored actor listens again.
        let app = in_netns(&ns.path, move || bind_retrying(listen, false, BIND_IN_USE_RETRY)).unwrap();
        app.set_nonblocking(true).unwrap();
        let app = TcpListener::from_std(app).unwrap();
        handover.finish().await;
        let (mut conn, peer) = app.accept().await.unwrap();
        assert!(peer.ip().is_loopback(), "{peer}");
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        conn.write_all(b"world").await.unwrap();
        cr.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"world");
        // The rules stay for KEEP_RULES after the handover, then come out
        // in the background.
        let rules = iptables_in(&ns.path, "ip6tables", &["-S", "INPUT"]).await.unwrap();
        assert!(String::from_utf8_lossy(&rules.stdout).contains("--dports 7070"), "kept after the handover");
        assert!(wait_rules_gone(&ns.path, "ip6tables", "7070").await, "the SYN-drop rules are still there after the handover");
    }

    /// Whether no rule of `tool` in `netns` names `port` (polled; liveness
    /// bound only: KEEP_RULES and then some).
    async fn wait_rules_gone(netns: &Path, tool: &str, port: &str) -> bool {
        for _ in 0..600 {
            let rules = iptables_in(netns, tool, &["-S", "INPUT"]).await.unwrap();
            if !String::from_utf8_lossy(&rules.stdout).contains(port) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The ports held again soon after a handover take over the pair it
    /// left in: one pair, not two, and it goes after the next handover.
    #[tokio::test]
    async fn a_hold_soon_after_a_handover_takes_its_rules_over() {
        let ns = TestNetns::new();
        let listen = addr("127.0.0.1:7072");
        let (wake, _woken) = mpsc::unbounded_channel();
        let armed = Armed::arm(&ns.path, vec![listen], wake.clone()).unwrap();
        armed.begin_handover().await.finish().await;
        let armed = Armed::arm(&ns.path, vec![listen], wake).unwrap();
        let handover = armed.begin_handover().await;
        let rules = iptables_in(&ns.path, "iptables", &["-S", "INPUT"]).await.unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert_eq!(rules.matches("--dports 7072").count(), 2, "one pair (accept, drop): {rules}");
        assert!(!take_kept_rules(&ns.path, &[listen]), "taken over, not kept twice");
        handover.finish().await;
        assert!(wait_rules_gone(&ns.path, "iptables", "7072").await, "the SYN-drop rules are still there after the handover");
    }

    /// Once a hold failed ("Address already in use") when another thread
    /// had just forked: the child keeps a copy of a listener just closed
    /// until its exec.
    #[test]
    fn a_port_closed_elsewhere_a_moment_later_is_bound() {
        let other = StdListener::bind("127.0.0.1:0").unwrap();
        let listen = other.local_addr().unwrap();
        let e = bind_retrying(listen, false, Duration::ZERO).expect_err("the port is in use");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE));
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(other);
        });
        // Liveness bound only: the port is free after 50 ms.
        let l = bind_retrying(listen, false, Duration::from_secs(60)).unwrap();
        assert_eq!(l.local_addr().unwrap(), listen);
        closer.join().unwrap();
    }

    /// Held connections are bounded: one over the bound is reset.
    #[tokio::test]
    async fn connections_over_the_bound_are_reset() {
        let ns = TestNetns::new();
        let listen = addr("127.0.0.1:7071");
        let (wake, mut woken) = mpsc::unbounded_channel();
        let _armed = Armed::arm_bounded(&ns.path, vec![listen], wake, 2).unwrap();
        let mut kept = Vec::new();
        for _ in 0..2 {
            let mut c = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
            c.write_all(b"x").await.unwrap();
            woken.recv().await.unwrap();
            kept.push(c);
        }
        let mut over = connect_in(&ns.path, listen, CONNECT_DEADLINE).await.unwrap();
        let mut buf = [0u8; 1];
        // Liveness bound only: without the bound it would be held forever.
        let r = tokio::time::timeout(Duration::from_secs(60), over.read(&mut buf)).await.expect("the connection over the bound was held");
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
    }

    /// Once the accept loop ended on its first error (EMFILE), leaving the
    /// port dead.
    #[tokio::test]
    async fn the_accept_loop_survives_errors() {
        let mut script = vec![
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Err(std::io::Error::from_raw_os_error(libc::ENFILE)),
            Ok(1),
            Err(std::io::Error::from_raw_os_error(libc::EMFILE)),
            Ok(2),
        ]
        .into_iter();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(
            addr("127.0.0.1:1"),
            move || {
                let next = script.next();
                async move {
                    match next {
                        Some(r) => r,
                        None => std::future::pending().await,
                    }
                }
            },
            tx,
        ));
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        task.abort();
    }

    /// The proxy's connect does not block the shim's runtime: on a
    /// one-thread runtime, other work goes on while a connect hangs (its
    /// SYNs dropped).
    #[test]
    fn a_hanging_connect_does_not_block_the_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let ns = TestNetns::new();
            let out = iptables_in(&ns.path, "iptables", &["-A", "OUTPUT", "-p", "tcp", "--dport", "7072", "-j", "DROP"]).await.unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let connect = connect_in(&ns.path, addr("127.0.0.1:7072"), Duration::from_secs(600));
            let (tx, rx) = oneshot::channel();
            tokio::spawn(async move { tx.send(()).unwrap() });
            tokio::select! {
                r = connect => panic!("the connect ended first: {:?}", r.map(|_| ())),
                r = rx => r.unwrap(),
            }
        });
    }
}
