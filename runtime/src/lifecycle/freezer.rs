//! The cgroup-freezer steps shared by a freeze, the freeze tier (entered
//! by a suspend, left by a resume, a stop or its checkpoint) and the
//! rollback of a failed checkpoint: pausing every app container, thawing
//! them, and watching a frozen actor's own listeners.
//!
//! **Waking on connections while in the freeze tier.** The actor's own
//! listening sockets stay as they are (bound, with their backlog): the
//! shim takes a descriptor of each (`pidfd_getfd(2)`, the same open socket,
//! not a copy) and watches it with the classification of the held ports
//! ([`crate::system::held_ports::Armed::arm_listeners`]): a kubelet probe
//! (a bare connect, an HTTP GET by `kube-probe/`) is answered by the shim and
//! does not thaw the actor; the first real connection thaws it, and the
//! connections the shim accepted meanwhile are proxied to it (as after a
//! resume from SUSPENDED); every later one is accepted by the actor itself,
//! with its real peer. Holding them in shim listeners instead would need
//! the actor's sockets closed, which a frozen process cannot do. The socket
//! is made non-blocking for the shim's watch while the actor cannot see it
//! (frozen), and given back its own file status flags, with the shim's
//! descriptors closed, before the actor is thawed or dumped (CRIU dumps
//! the flags; a shim descriptor left open would keep the port bound after
//! the dump).
//!
//! The thaw writes the cgroup freezer directly (v1 `freezer.state`, v2
//! `cgroup.freeze`: what `runc resume` does, without its start-up), falling
//! back to `runc resume`; that cgroup primitive lives here.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::actor::record::{FreezeTier, Lifecycle, Record};
use crate::error::{Error, IoContext, Result};
use crate::lifecycle::state::FrozenWatch;
use crate::lifecycle::{lock, Actor};
use crate::system::cgroup;
use crate::system::held_ports;
use crate::system::pidfd;
use crate::task::Status;

impl Actor {
    /// Pauses every running container of `ids`; on a failure thaws the
    /// ones paused so far and records the actor RUNNING, with the reason.
    pub(crate) async fn pause_all(&self, ids: &[String]) -> Result<()> {
        let mut paused: Vec<&String> = Vec::new();
        for id in ids {
            if self.tasks.status(id) != Some(Status::Running) {
                continue;
            }
            if let Err(e) = self.tasks.pause(id).await {
                for p in &paused {
                    let _ = self.tasks.resume(p).await;
                }
                let actor = self.update(|rec| {
                    rec.state = Lifecycle::Running;
                    rec.fenced = None;
                    rec.freeze_tier = None;
                    rec.last_error = Some(format!("freeze failed: {e}"));
                    rec.actor.clone()
                })?;
                return Err(e.context(&format!("freeze of actor {actor}")));
            }
            paused.push(id);
        }
        Ok(())
    }

    /// The window of the freeze tier the actor is in, if it is.
    pub fn freeze_tier(&self) -> Option<FreezeTier> {
        self.record().filter(Record::in_freeze_tier).and_then(|r| r.freeze_tier)
    }

    /// Whether container `id` is one of the actor's, frozen in the freeze
    /// tier (RUNNING to containerd).
    pub fn frozen_in_tier(&self, id: &str) -> bool {
        self.record().is_some_and(|r| r.in_freeze_tier() && r.containers.iter().any(|c| c == id))
    }

    /// Told whenever the freeze tier begins or ends.
    pub fn freeze_changed(&self) -> Arc<tokio::sync::Notify> {
        self.freeze_changed.clone()
    }

    /// Before the checkpoint of an actor in the freeze tier: its listeners
    /// are given back. When real connections arrived meanwhile the actor is
    /// wanted: it is thawed instead (they are handed to it), and the
    /// checkpoint refused (`WrongState`).
    pub(crate) async fn leave_freeze_tier(&self, rec: &Record) -> Result<()> {
        let watch = lock(&self.frozen_watch).take();
        let Some(handover) = (match watch {
            Some(w) => w.release().await,
            None => None,
        }) else {
            return Ok(());
        };
        if handover.is_empty() {
            return Ok(());
        }
        info!(actor = rec.actor.as_str(), "freeze tier: connections arrived before the checkpoint: thawed instead");
        let r = self.thaw_containers(rec).await.and_then(|_| self.record_thawed(Instant::now(), None));
        handover.finish().await;
        let rec = r?;
        Err(Error::WrongState(format!("actor {}: connections arrived while it was frozen: thawed instead of checkpointed", rec.actor)))
    }

    /// After a failed checkpoint of an actor in the freeze tier: thawed and
    /// RUNNING, with the reason (a failed suspend leaves the actor running).
    pub(crate) async fn thaw_after_failed_checkpoint(&self, rec: &Record, why: &Error) {
        if let Err(e) = self.thaw_containers(rec).await {
            warn!(actor = rec.actor.as_str(), "thaw after a failed checkpoint of the freeze tier: {e}");
        }
        let r = self.update(|r| {
            r.state = Lifecycle::Running;
            r.freeze_tier = None;
            r.last_error = Some(format!("checkpoint of the freeze tier failed, the actor was thawed and runs: {why}"));
        });
        if let Err(e) = r {
            warn!(actor = rec.actor.as_str(), "save the actor record: {e}");
        }
        self.freeze_changed.notify_one();
    }

    /// The fast path of a resume: an actor in the freeze tier is thawed
    /// (no CRIU). `None` when it is not in the freeze tier (the resume goes
    /// on as usual).
    pub(crate) async fn thaw_freeze_tier(&self) -> Result<Option<Record>> {
        let started = Instant::now();
        if !self.record().is_some_and(|r| r.in_freeze_tier()) {
            return Ok(None);
        }
        let _gate = self.gate.lock().await;
        let dir = self.dir().ok_or_else(super::no_actor)?;
        let rec = self.record().ok_or_else(super::no_actor)?;
        if !rec.in_freeze_tier() {
            return Ok(None);
        }
        // Only while this node still holds the actor's lease.
        if let Err(e) = self.confirm_lease(&rec.actor, &dir.key()).await {
            return Err(self.refused(&rec, "thaw", None, e));
        }
        self.thaw_tier_locked(&rec, started).await.map(Some)
    }

    /// The thaw of an actor in the freeze tier, under the gate, its lease
    /// confirmed.
    pub(crate) async fn thaw_tier_locked(&self, rec: &Record, started: Instant) -> Result<Record> {
        let rec = rec.clone();
        let watch = lock(&self.frozen_watch).take();
        let handover = match watch {
            Some(w) => w.release().await,
            None => None,
        };
        if let Err(e) = self.thaw_containers(&rec).await {
            // Still frozen: watched again, the window goes on.
            warn!(actor = rec.actor.as_str(), "thaw failed, the actor stays FROZEN: {e}");
            let ids = rec.containers.clone();
            *lock(&self.frozen_watch) = Some(self.watch_frozen_listeners(&ids));
            if let Some(h) = handover {
                h.finish().await;
            }
            self.update(|r| r.last_error = Some(format!("thaw failed: {e}")))?;
            return Err(e);
        }
        if let Some(dir) = self.dir() {
            self.refresh_lease(&rec.actor, &dir.key()).await;
        }
        // The connections go in first: a thaw has no checkpoint that the
        // actor's serving would make stale (a shim death kills a FROZEN
        // actor as a RUNNING one), so RUNNING is recorded after.
        if let Some(h) = handover {
            h.finish().await;
        }
        let rec = self.record_thawed(started, None)?;
        info!(actor = rec.actor.as_str(), ms = rec.last_resume_ms, "actor thawed (freeze tier)");
        Ok(rec)
    }

    /// RUNNING after a thaw of the freeze tier.
    fn record_thawed(&self, started: Instant, last_error: Option<String>) -> Result<Record> {
        let rec = self.update(|r| {
            r.state = Lifecycle::Running;
            r.freeze_tier = None;
            r.last_error = last_error;
            r.last_resume_ms = Some(started.elapsed().as_millis() as u64);
            r.clone()
        });
        self.freeze_changed.notify_one();
        rec
    }

    /// Thaws every paused container of the actor: the cgroup freezer
    /// written directly, else `runc resume`.
    async fn thaw_containers(&self, rec: &Record) -> Result<()> {
        for id in &rec.containers {
            if self.tasks.status(id) != Some(Status::Paused) {
                continue;
            }
            let direct = match rec.cgroups.get(id) {
                Some(cg) => {
                    let cg = cg.clone();
                    self.tasks.resume_by(id, Box::new(move || thaw_cgroup(&cg))).await
                }
                None => Err(Error::FailedPrecondition(format!("container {id} has no cgroup path"))),
            };
            if let Err(e) = direct {
                debug!(container = id.as_str(), "direct thaw: {e}; runc resume");
                self.tasks.resume(id).await?;
            }
        }
        Ok(())
    }

    /// After a restore every container of `rec` runs: one whose cgroup
    /// says frozen (the freezer's state belongs to the cgroup, not to the
    /// restored processes) is thawed, with a warning; runc's state would
    /// call it paused and refuse an exec into it. Nothing is done where
    /// the cgroup cannot be read.
    pub(crate) fn thaw_if_frozen(&self, rec: &Record) {
        for id in &rec.containers {
            let Some(cg) = rec.cgroups.get(id) else { continue };
            let state = match cgroup::Roots::host().of_path(cg).and_then(|c| c.freezer_state()) {
                Ok(s) => s,
                Err(e) => {
                    debug!(container = id.as_str(), "the restored container's freezer state: {e}");
                    continue;
                }
            };
            if state == cgroup::FreezerState::Thawed {
                continue;
            }
            warn!(container = id.as_str(), cgroup = cg.as_str(), ?state, "restored into a frozen cgroup: thawing it");
            if let Err(e) = thaw_cgroup(cg) {
                warn!(container = id.as_str(), "thaw of the restored container's cgroup: {e}");
            }
        }
    }

    /// Watches the actor's own listening sockets (see the module doc); an
    /// empty watch when none can be taken (a warning says why).
    pub(crate) fn watch_frozen_listeners(&self, ids: &[String]) -> FrozenWatch {
        let (netns, target) = self.activation_target(ids);
        let ports: HashSet<u16> = target.iter().map(SocketAddr::port).collect();
        let rec = self.record();
        let pids: Vec<i32> = ids.iter().flat_map(|id| self.processes_of(rec.as_ref(), id)).collect();
        let mut watch = FrozenWatch { armed: None, flags: Vec::new() };
        let Some(netns) = netns else { return watch };
        let taken = take_listeners(&pids, &ports);
        if taken.is_empty() {
            if !ports.is_empty() {
                warn!(ports = ?ports, "freeze tier: no listener of the actor could be watched: connections do not thaw it");
            }
            return watch;
        }
        let mut listeners = Vec::new();
        for t in taken {
            watch.flags.push((t.keep, t.flags));
            listeners.push((t.listener, t.addr));
        }
        match held_ports::Armed::arm_listeners(&netns, listeners, self.wake.clone()) {
            Ok(a) => watch.armed = Some(a),
            Err(e) => warn!("freeze tier: connections do not thaw the actor: {e}"),
        }
        watch
    }
}

/// One listening socket of the frozen actor, taken for the watch.
struct Taken {
    listener: StdListener,
    addr: SocketAddr,
    /// Another descriptor of it, to give the flags back.
    keep: OwnedFd,
    flags: libc::c_int,
}

/// The TCP listening sockets (on `ports`, all when empty) of processes
/// `pids`, each taken once, made non-blocking.
fn take_listeners(pids: &[i32], ports: &HashSet<u16>) -> Vec<Taken> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for &pid in pids {
        let mut pidfd = None;
        for (fd, inode) in pidfd::sockets_of(pid) {
            if seen.contains(&inode) {
                continue;
            }
            if pidfd.is_none() {
                match pidfd::open(pid) {
                    Ok(p) => pidfd = Some(p),
                    Err(e) => {
                        warn!(pid, "freeze tier: pidfd_open: {e}");
                        break;
                    }
                }
            }
            let Some(pfd) = &pidfd else { break };
            let ours = match pidfd::get_fd(pfd, fd) {
                Ok(o) => o,
                Err(e) => {
                    debug!(pid, fd, "freeze tier: pidfd_getfd: {e}");
                    continue;
                }
            };
            let Some(addr) = tcp_listener_addr(&ours) else { continue };
            seen.insert(inode);
            if !ports.is_empty() && !ports.contains(&addr.port()) {
                continue;
            }
            match prepare(ours, addr) {
                Ok(t) => out.push(t),
                Err(e) => warn!(listen = %addr, "freeze tier: {e}"),
            }
        }
    }
    out
}

/// Saves the socket's flags, makes it non-blocking for the shim's watch.
fn prepare(ours: OwnedFd, addr: SocketAddr) -> Result<Taken> {
    let keep = ours.try_clone().io_context(|| format!("dup the listener on {addr}"))?;
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::Io { context: format!("make the listener on {addr} non-blocking"), source: std::io::Error::last_os_error() });
    }
    Ok(Taken { listener: StdListener::from(ours), addr, keep, flags })
}

/// The address of a listening TCP socket (IPv4 or IPv6); `None` for any
/// other descriptor.
fn tcp_listener_addr(fd: &OwnedFd) -> Option<SocketAddr> {
    let opt = |level: libc::c_int, name: libc::c_int| -> Option<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: an int-sized option into an int that lives for the call.
        let r = unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut v as *mut libc::c_int).cast(), &mut len) };
        (r == 0).then_some(v)
    };
    let domain = opt(libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    if !(domain == libc::AF_INET || domain == libc::AF_INET6)
        || opt(libc::SOL_SOCKET, libc::SO_PROTOCOL)? != libc::IPPROTO_TCP
        || opt(libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? != 1
    {
        return None;
    }
    // SAFETY: a zeroed sockaddr_storage, large enough for any address.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname into storage that lives for the call, its size given.
    if unsafe { libc::getsockname(fd.as_raw_fd(), (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return None;
    }
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET).
            let a: libc::sockaddr_in = unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6).
            let a: libc::sockaddr_in6 = unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id)))
        }
        _ => None,
    }
}

/// How many times the freezer is read back after a thaw (the v1 write
/// returns thawed; v2 settles asynchronously, within microseconds).
const THAW_CHECKS: usize = 2000;

/// Thaws cgroup `path` by writing its freezer ([`cgroup::Cgroup::thaw`]),
/// and waits until it says thawed.
fn thaw_cgroup(path: &str) -> Result<()> {
    let cg = cgroup::Roots::host().of_path(path)?;
    cg.thaw()?;
    for i in 0..THAW_CHECKS {
        if cg.freezer_state()? == cgroup::FreezerState::Thawed {
            return Ok(());
        }
        if i > 10 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Err(Error::FailedPrecondition(format!("cgroup {cg} does not say thawed after the thaw")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A listener of this process is found, taken (the same socket: a
    /// connection accepted through the taken descriptor is one made to the
    /// original), made non-blocking, and given its flags back.
    #[test]
    fn takes_a_processes_own_listener_and_gives_its_flags_back() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let me = std::process::id() as i32;
        let ports: HashSet<u16> = [addr.port()].into();
        let taken = take_listeners(&[me], &ports);
        assert_eq!(taken.len(), 1, "only the listener on the port asked for");
        assert_eq!(taken[0].addr, addr);
        // SAFETY: F_GETFL.
        let fl = unsafe { libc::fcntl(l.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(fl & libc::O_NONBLOCK, 0, "the shared socket is non-blocking while watched");
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"x").unwrap();
        let (mut s, _) = taken[0].listener.accept().unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        let t = taken.into_iter().next().unwrap();
        // SAFETY: F_SETFL.
        unsafe { libc::fcntl(t.keep.as_raw_fd(), libc::F_SETFL, t.flags) };
        // SAFETY: F_GETFL.
        let fl = unsafe { libc::fcntl(l.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_NONBLOCK, 0, "flags given back");
        // Every TCP listener without a port filter; never a UDP socket.
        let all: Vec<SocketAddr> = take_listeners(&[me], &HashSet::new()).iter().map(|t| t.addr).collect();
        assert!(all.contains(&addr) && all.contains(&other.local_addr().unwrap()), "{all:?}");
        assert!(!all.contains(&client.local_addr().unwrap()));
    }
}
