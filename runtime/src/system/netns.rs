//! The pod's network namespace, from the shim's side: which TCP ports the
//! actor listens on, running code or iptables inside the namespace, and the
//! network lock of a suspend's dump.

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};
use tracing::warn;

use crate::error::{Error, IoContext, Result};

/// Deadline of one iptables call. iptables waits at most
/// [`XTABLES_WAIT_S`] for the xtables lock, then fails on its own.
pub const IPTABLES_DEADLINE: Duration = Duration::from_secs(30);
const XTABLES_WAIT_S: &str = "10";

/// The TCP sockets in LISTEN state in the network namespace of `pid`: the
/// address each is bound to (`0.0.0.0` and `::` stay wildcards, a
/// loopback address stays loopback) and its port, from `/proc/<pid>/net/tcp`
/// and `tcp6`; an IPv4-mapped IPv6 address is given as the IPv4 one.
/// Sorted, without duplicates (`SO_REUSEPORT` groups list one socket each).
pub fn listening_ports(pid: i32) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        out.extend(parse_listeners(&text));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The LISTEN sockets of one `/proc/net/tcp` or `tcp6` table.
fn parse_listeners(text: &str) -> Vec<SocketAddr> {
    rows(text).filter(|(state, _, _)| *state == "0A").map(|(_, local, _)| local).collect()
}

/// A TCP connection in a network namespace, from that namespace's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TcpConnection {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// The state of a connection a checkpoint keeps whole (CRIU's
/// `tcp-established`) and whose peer may send a request to: ESTABLISHED
/// (`include/net/tcp_states.h`). A connection already closing is left to
/// close (its peer's FIN or ACK must not wake a sleeping actor).
const ESTABLISHED: &str = "01";

/// The TCP connections of the network namespace of `pid` that are
/// established (see [`ESTABLISHED`]), from `/proc/<pid>/net/tcp` and
/// `tcp6`; IPv4-mapped addresses as IPv4 ones. Sorted, without duplicates.
pub fn open_connections(pid: i32) -> Vec<TcpConnection> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        out.extend(parse_connections(&text));
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn parse_connections(text: &str) -> Vec<TcpConnection> {
    rows(text).filter(|(state, _, _)| *state == ESTABLISHED).map(|(_, local, remote)| TcpConnection { local, remote }).collect()
}

/// The rows of a `/proc/net/tcp` or `tcp6` table: (state in hex, local
/// address, remote address); a row that does not parse is skipped.
fn rows(text: &str) -> impl Iterator<Item = (&str, SocketAddr, SocketAddr)> {
    text.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() <= 3 {
            return None;
        }
        Some((f[3], parse_proc_addr(f[1])?, parse_proc_addr(f[2])?))
    })
}

/// `ADDR:PORT` as the kernel prints it; an IPv4-mapped IPv6 address is
/// given as the IPv4 one.
fn parse_proc_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let ip = match parse_proc_ip(addr)? {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    Some(SocketAddr::new(ip, u16::from_str_radix(port, 16).ok()?))
}

/// An address as the kernel prints it in `/proc/net/tcp*`: 32-bit words in
/// hex, each in host byte order.
fn parse_proc_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| hex.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_ne_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// Connects to `addr` from inside the network namespace `netns` without
/// blocking the caller: the socket is made in the namespace (a socket keeps
/// the namespace it was made in) on a blocking-pool thread, then connected
/// asynchronously, within `deadline`.
pub async fn connect_in(netns: &Path, addr: SocketAddr, deadline: Duration) -> Result<TcpStream> {
    let ns = netns.to_path_buf();
    let socket =
        tokio::task::spawn_blocking(move || in_netns(&ns, move || if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }))
            .await
            .map_err(|e| Error::InvalidArgument(format!("socket in {netns:?}: {e}")))??;
    match tokio::time::timeout(deadline, socket.connect(addr)).await {
        Ok(r) => r.io_context(|| format!("connect to {addr} in {netns:?}")),
        Err(_) => Err(Error::Io {
            context: format!("connect to {addr} in {netns:?}: no answer within {deadline:?}"),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline exceeded"),
        }),
    }
}

/// Connects to `to` from inside the network namespace `netns` with the
/// source address `from`, which need not be local: a transparent socket
/// (`IP_TRANSPARENT` / `IPV6_TRANSPARENT`, see `ip(7)`), as a TPROXY
/// proxy's upstream is, so that the peer sees `from` as the client. The
/// replies come back to it only where a route delivers `to`'s answers to
/// `from` locally (the held ports' routing rule). Within `deadline`.
pub async fn connect_transparent_in(netns: &Path, from: SocketAddr, to: SocketAddr, deadline: Duration) -> Result<TcpStream> {
    let ns = netns.to_path_buf();
    let socket = tokio::task::spawn_blocking(move || {
        in_netns(&ns, move || {
            let s = if to.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
            let (level, opt) = if to.is_ipv4() { (libc::SOL_IP, libc::IP_TRANSPARENT) } else { (libc::SOL_IPV6, libc::IPV6_TRANSPARENT) };
            let one: libc::c_int = 1;
            // SAFETY: a c_int option that lives for the call, on a socket we own.
            let rc = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    level,
                    opt,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            s.bind(from)?;
            Ok(s)
        })
    })
    .await
    .map_err(|e| Error::InvalidArgument(format!("transparent socket in {netns:?}: {e}")))?
    .map_err(|e| Error::InvalidArgument(format!("transparent socket from {from} in {netns:?}: {e}")))?;
    match tokio::time::timeout(deadline, socket.connect(to)).await {
        Ok(r) => r.io_context(|| format!("connect from {from} to {to} in {netns:?}")),
        Err(_) => Err(Error::Io {
            context: format!("connect from {from} to {to} in {netns:?}: no answer within {deadline:?}"),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline exceeded"),
        }),
    }
}

/// The IPv6 TCP listeners of the network namespace of `pid` that are
/// IPv6-only (`IPV6_V6ONLY`), which `/proc/net/tcp6` does not tell: asked
/// of `sock_diag(7)` (`INET_DIAG_SKV6ONLY`) from inside the namespace.
pub fn v6_only_listeners(pid: i32) -> Result<Vec<SocketAddr>> {
    in_netns(Path::new(&format!("/proc/{pid}/ns/net")), v6_only_listeners_here)
}

/// [`v6_only_listeners`] of this thread's network namespace.
fn v6_only_listeners_here() -> std::io::Result<Vec<SocketAddr>> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{nlas::Nla, ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket as NetlinkSocket, SocketAddr as NetlinkAddr};

    let mut socket = NetlinkSocket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&NetlinkAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family: AF_INET6,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::LISTEN,
            socket_id: SocketId::new_v6(),
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut out = Vec::new();
    let mut recv = Vec::with_capacity(64 * 1024);
    loop {
        recv.clear();
        let n = socket.recv(&mut recv, 0)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "sock_diag: no end of the dump"));
        }
        let mut at = 0;
        while at < n {
            let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&recv[at..n])
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("sock_diag answer: {e}")))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r))
                    if r.nlas.iter().any(|a| matches!(a, Nla::SkV6Only(true))) =>
                {
                    let id = &r.header.socket_id;
                    out.push(SocketAddr::new(id.source_address, id.source_port));
                }
                NetlinkPayload::Done(_) => {
                    out.sort_unstable();
                    out.dedup();
                    return Ok(out);
                }
                NetlinkPayload::Error(e) => return Err(std::io::Error::other(format!("sock_diag: {e}"))),
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

/// Runs `f` on a thread that has entered the network namespace `netns`
/// (and waits for it: call it from a blocking context, or for work that
/// does not block, such as a bind).
pub fn in_netns<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T> {
    in_namespace(netns, nix::sched::CloneFlags::CLONE_NEWNET, "network namespace", f)
}

/// Runs `f` on a thread of its own that has entered the namespace at `path`
/// (`kind`: `CLONE_NEWNET`, `CLONE_NEWIPC`...; `what` names it in errors),
/// and waits for it. setns(2) moves the calling thread only, so never a
/// pool's thread: one that ends with `f`.
pub fn in_namespace<T: Send + 'static>(
    path: &Path,
    kind: nix::sched::CloneFlags,
    what: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    let ns = File::open(path).io_context(|| format!("open {what} {path:?}"))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, kind).map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .map_err(|_| Error::InvalidArgument(format!("thread in {path:?} panicked")))?
    .io_context(|| format!("in {what} {path:?}"))
}

/// Runs `iptables ARGS` (or ip6tables) in the network namespace `netns`,
/// through the reaper (the shim reaps all its children), within
/// [`IPTABLES_DEADLINE`].
pub async fn iptables_in(netns: &Path, tool: &str, args: &[&str]) -> Result<std::process::Output> {
    crate::system::reaper::output(xtables_in(netns, tool, args)?, IPTABLES_DEADLINE).await
}

/// `TOOL -w XTABLES_WAIT_S ARGS`: an xtables tool (`iptables`,
/// `ip6tables-restore`...) started in the network namespace `netns`, as
/// `nsenter --net` would, without the extra process: the child joins the
/// namespace (`setns`) between fork and exec.
fn xtables_in(netns: &Path, tool: &str, args: &[&str]) -> Result<std::process::Command> {
    let mut cmd = command_in(netns, tool)?;
    cmd.args(["-w", XTABLES_WAIT_S]).args(args);
    Ok(cmd)
}

/// Deadline of one `ip -batch` (a few rules and routes).
pub const IP_DEADLINE: Duration = Duration::from_secs(10);

/// `ip FAMILY -force -batch` of `batch` (`FAMILY`: `-4` or `-6`; one
/// command a line, as `ip` takes them) in the network namespace `netns`, the lines passed on a memfd as fd 3,
/// within [`IP_DEADLINE`]. A line that fails only with one of the messages
/// in `fine` (e.g. `File exists` for an add) is no error. `what` names the
/// change in an error.
pub(crate) async fn ip_batch(netns: &Path, family: &str, batch: &str, fine: &[&str], what: &str) -> Result<()> {
    let fd = nix::sys::memfd::memfd_create(c"torpor-ip-batch", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .io_context(|| format!("memfd_create for the commands to {what}"))?;
    let mut f = File::from(fd);
    std::io::Write::write_all(&mut f, batch.as_bytes()).io_context(|| format!("write the commands to {what}"))?;
    let mut cmd = command_in(netns, "ip")?;
    cmd.args([family, "-force", "-batch", "/dev/fd/3"]);
    crate::system::reaper::pass_fds(&mut cmd, vec![f], 3);
    let o = crate::system::reaper::output(cmd, IP_DEADLINE).await?;
    let stderr = String::from_utf8_lossy(&o.stderr);
    let bad: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Command failed") && !fine.iter().any(|m| l.contains(m)))
        .collect();
    if !o.status.success() && !bad.is_empty() {
        return Err(Error::InvalidArgument(format!("{what} in {netns:?}: ip: {}", bad.join("; "))));
    }
    Ok(())
}

/// `PROGRAM`, to be started in the network namespace `netns`: the child
/// joins it (`setns`) between fork and exec.
fn command_in(netns: &Path, program: &str) -> Result<std::process::Command> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ns = File::open(netns).io_context(|| format!("open the network namespace {netns:?} for {program}"))?;
    let mut cmd = std::process::Command::new(program);
    // SAFETY: between fork and exec only setns(2) (async-signal-safe) on a
    // descriptor opened before the fork; `ns` is only kept alive.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// The network lock of a dump, as CRIU's own `iptables` lock: a `CRIU`
/// chain, jumped to first from `INPUT` and `OUTPUT`, drops every packet but
/// CRIU's TCP repair traffic (its mark, `SOCCR_MARK`). The same chain as
/// CRIU's, so that [`unlock_criu_network`] lifts either.
const LOCK_RULES: &str = "*filter\n:CRIU - [0:0]\n-I INPUT -j CRIU\n-I OUTPUT -j CRIU\n\
                          -A CRIU -m mark --mark 0xC114 -j ACCEPT\n-A CRIU -j DROP\nCOMMIT\n";

/// Locks the pod's network namespace for a dump: no packet comes in or goes
/// out (a client's packets are dropped and retransmitted later, never
/// answered with a reset) until [`unlock_criu_network`].
///
/// A suspend takes the lock itself, once for the whole pod, and dumps with
/// CRIU's `network-lock skip`. CRIU records the method of the dump in the
/// image and uses it at the restore whatever it is told then; a dump that
/// CRIU locked with iptables would cost every restore of it seven iptables
/// runs (a lock, and an unlock of five: about 80 ms).
///
/// One `iptables-restore` (and `ip6tables-restore` where the kernel has
/// IPv6) in the namespace, the rules passed on a memfd. A failure may leave
/// a part in place: the caller unlocks.
pub async fn lock_network(netns: &Path) -> Result<()> {
    for tool in restore_tools() {
        xtables_restore(netns, tool, LOCK_RULES, "lock the network for the dump").await?;
    }
    Ok(())
}

/// `iptables-restore`, and `ip6tables-restore` where the kernel has IPv6.
pub(crate) fn restore_tools() -> &'static [&'static str] {
    if Path::new("/proc/net/if_inet6").exists() {
        &["iptables-restore", "ip6tables-restore"]
    } else {
        &["iptables-restore"]
    }
}

/// `TOOL --noflush` (`iptables-restore` or `ip6tables-restore`) of `rules`
/// in the network namespace `netns`: one transaction, the rules passed on a
/// memfd as fd 3. `what` names the change in an error.
pub(crate) async fn xtables_restore(netns: &Path, tool: &str, rules: &str, what: &str) -> Result<()> {
    let fd = nix::sys::memfd::memfd_create(c"torpor-xtables-rules", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .io_context(|| format!("memfd_create for the rules to {what}"))?;
    let mut f = File::from(fd);
    std::io::Write::write_all(&mut f, rules.as_bytes()).io_context(|| format!("write the rules to {what}"))?;
    let mut cmd = xtables_in(netns, tool, &["--noflush", "/dev/fd/3"])?;
    crate::system::reaper::pass_fds(&mut cmd, vec![f], 3);
    let o = crate::system::reaper::output(cmd, IPTABLES_DEADLINE).await?;
    if !o.status.success() {
        return Err(Error::InvalidArgument(format!("{what} in {netns:?}: {tool}: {}", String::from_utf8_lossy(&o.stderr).trim())));
    }
    Ok(())
}

/// Takes rules out of the pod's network namespace `netns` in the
/// background, off the caller's path: once `ready` is done, `remove` runs,
/// unless the namespace is gone by then (a pod going away takes its rules
/// along); a failure is logged with `what`. Without a tokio runtime the
/// rules stay, with a warning.
pub fn remove_rules_later<R, F, Fut>(netns: PathBuf, what: &'static str, ready: R, remove: F)
where
    R: Future<Output = ()> + Send + 'static,
    F: FnOnce(PathBuf) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                ready.await;
                if !netns.exists() {
                    return;
                }
                if let Err(e) = remove(netns).await {
                    warn!("{what}: {e}");
                }
            });
        }
        Err(e) => warn!(netns = ?netns, "{what}: the rules stay: {e}"),
    }
}

/// The pieces of a dump's network lock, taken out in this order.
const UNLOCK_PIECES: [&str; 4] = ["-D INPUT -j CRIU", "-D OUTPUT -j CRIU", "-F CRIU", "-X CRIU"];

/// What an xtables tool says when what it was to remove is not there.
pub(crate) fn nothing_to_remove(stderr: &str) -> bool {
    ["No chain", "does not exist", "does a matching rule exist", "Bad rule"].iter().any(|m| stderr.contains(m))
}

/// The outcome of taking rules out with several tools (one per family):
/// an error naming each failure; rules that were gone already
/// ([`nothing_to_remove`]) are fine, logged at debug.
pub(crate) fn removal_outcome(results: impl IntoIterator<Item = Result<()>>) -> Result<()> {
    let mut errors = Vec::new();
    for r in results {
        if let Err(e) = r {
            let text = e.to_string();
            if nothing_to_remove(&text) {
                tracing::debug!("{text}");
            } else {
                errors.push(text);
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(errors.join("; ")))
    }
}

/// Removes a dump's network lock from the pod's network namespace
/// ([`lock_network`]'s, or the one CRIU leaves after a dump it locked): the
/// pod must stay reachable while suspended, for probes and activation.
///
/// Per family (both at once) one `iptables-restore` that takes out the
/// whole lock; when it is not all there (a lock that failed halfway, or
/// none), its pieces one by one, each one that is missing being fine.
pub async fn unlock_criu_network(netns: &Path) -> Result<()> {
    let unlock = |restore: &'static str, tool: &'static str| async move {
        if !restore_tools().contains(&restore) {
            return String::new();
        }
        let all = format!("*filter\n{}\nCOMMIT\n", UNLOCK_PIECES.join("\n"));
        match xtables_restore(netns, restore, &all, "unlock the network after the dump").await {
            Ok(()) => String::new(),
            Err(_) => unlock_piecewise(netns, tool).await,
        }
    };
    let (v4, v6) = tokio::join!(unlock("iptables-restore", "iptables"), unlock("ip6tables-restore", "ip6tables"));
    let errors = v4 + &v6;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("unlock the network after the dump: {errors}")))
    }
}

/// The pieces of a network lock that are there, taken out with `tool`
/// one by one; what failed, as text (empty: nothing).
async fn unlock_piecewise(netns: &Path, tool: &str) -> String {
    let mut errors = String::new();
    for piece in UNLOCK_PIECES {
        let args: Vec<&str> = piece.split(' ').collect();
        match iptables_in(netns, tool, &args).await {
            Ok(o) if o.status.success() || nothing_to_remove(&String::from_utf8_lossy(&o.stderr)) => {}
            Ok(o) => errors.push_str(&format!("{tool} {piece}: {}; ", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => errors.push_str(&format!("{tool} {piece}: {e}; ")),
        }
    }
    errors
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A private network namespace with `lo` up, alive while this lives
    /// (a parked thread that unshared it); nothing of the host's is touched.
    pub(crate) struct TestNetns {
        pub path: PathBuf,
        pub tid: i32,
        stop: Option<std::sync::mpsc::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl TestNetns {
        pub fn new() -> TestNetns {
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                // lo up: SIOCGIFFLAGS, | IFF_UP, SIOCSIFFLAGS.
                // SAFETY: an ifreq that lives for the calls on a socket we own.
                unsafe {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                    assert!(fd >= 0);
                    let mut ifr: libc::ifreq = std::mem::zeroed();
                    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
                        *d = *s as libc::c_char;
                    }
                    assert!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) >= 0);
                    ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
                    assert!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) >= 0);
                    libc::close(fd);
                }
                ready_tx.send(nix::unistd::gettid().as_raw()).unwrap();
                let _ = stop_rx.recv();
            });
            let tid = ready_rx.recv().unwrap();
            TestNetns {
                path: PathBuf::from(format!("/proc/{}/task/{tid}/ns/net", std::process::id())),
                tid,
                stop: Some(stop_tx),
                thread: Some(thread),
            }
        }
    }

    impl Drop for TestNetns {
        fn drop(&mut self) {
            drop(self.stop.take());
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    #[test]
    fn listeners_keep_their_address() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1794 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 100 0 0 10 0
   3: 0A01A8C0:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
";
        let tcp6 = "  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F91 00000000000000000000000000000000:0000 0A 0
   1: 00000000000000000000000001000000:1795 00000000000000000000000000000000:0000 0A 0
   2: 0000000000000000FFFF00000100007F:1796 00000000000000000000000000000000:0000 0A 0
";
        let v4 = parse_listeners(tcp);
        let want: Vec<SocketAddr> = ["127.0.0.1:6036", "0.0.0.0:8080", "192.168.1.10:80"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(v4, want);
        let v6 = parse_listeners(tcp6);
        let want: Vec<SocketAddr> = ["[::]:8081", "[::1]:6037", "127.0.0.1:6038"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(v6, want);
    }

    /// This process's own listeners, read back from /proc with their
    /// addresses.
    #[test]
    fn listening_ports_of_a_live_process() {
        let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let found = listening_ports(std::process::id() as i32);
        assert!(found.contains(&lo.local_addr().unwrap()), "{found:?}");
        assert!(found.contains(&any.local_addr().unwrap()), "{found:?}");
        let lo_port = lo.local_addr().unwrap().port();
        assert!(!found.iter().any(|a| a.port() == lo_port && a.ip().is_unspecified()), "{found:?}");
        if let Ok(v6) = std::net::TcpListener::bind("[::1]:0") {
            assert!(listening_ports(std::process::id() as i32).contains(&v6.local_addr().unwrap()));
        }
    }

    /// The dump's lock drops every packet in the namespace (a connect over
    /// loopback goes unanswered) and the unlock lifts it completely.
    #[tokio::test]
    async fn the_network_lock_drops_everything_until_unlocked() {
        let ns = TestNetns::new();
        let listener = in_netns(&ns.path, || std::net::TcpListener::bind("127.0.0.1:7071")).unwrap();
        let connects = || async {
            let s =
                in_netns(&ns.path, || std::net::TcpStream::connect_timeout(&"127.0.0.1:7071".parse().unwrap(), Duration::from_millis(300)));
            s.is_ok()
        };
        assert!(connects().await);
        lock_network(&ns.path).await.unwrap();
        for tool in ["iptables", "ip6tables"] {
            let rules = iptables_in(&ns.path, tool, &["-S"]).await.unwrap();
            let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
            for r in ["-A INPUT -j CRIU", "-A OUTPUT -j CRIU", "-A CRIU -m mark --mark 0xc114 -j ACCEPT", "-A CRIU -j DROP"] {
                assert!(rules.contains(r), "{tool}: {r} in {rules}");
            }
        }
        assert!(!connects().await, "a connect through the lock");
        unlock_criu_network(&ns.path).await.unwrap();
        for tool in ["iptables", "ip6tables"] {
            let rules = iptables_in(&ns.path, tool, &["-S"]).await.unwrap();
            assert!(!String::from_utf8_lossy(&rules.stdout).contains("CRIU"), "{tool}: {rules:?}");
        }
        assert!(connects().await);
        // nothing locked, or half of a lock: lifted too
        unlock_criu_network(&ns.path).await.unwrap();
        iptables_in(&ns.path, "iptables", &["-N", "CRIU"]).await.unwrap();
        iptables_in(&ns.path, "iptables", &["-I", "INPUT", "-j", "CRIU"]).await.unwrap();
        unlock_criu_network(&ns.path).await.unwrap();
        let rules = iptables_in(&ns.path, "iptables", &["-S"]).await.unwrap();
        assert!(!String::from_utf8_lossy(&rules.stdout).contains("CRIU"), "{rules:?}");
        drop(listener);
    }
}
