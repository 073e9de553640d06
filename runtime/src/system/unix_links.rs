//! Unix stream connections between the containers of one pod: an app and
//! its sidecar talking over a socket on a shared volume, held open for the
//! pod's life.
//!
//! CRIU dumps one container's process tree at a time and refuses a socket
//! whose peer is outside it ("Can't dump half of stream unix connection").
//! [`find`] names each such connection: the two ends (container, socket
//! inode, and a process descriptor of it) and the bytes queued on it. The
//! lifecycle layer declares each end external to its container's dump
//! (`external unix[INODE]`) and gives it back at the restore
//! (`inherit-fd fd[N]:socket:[INODE]`).
//!
//! The pod's sockets are listed with `sock_diag(7)` (`NETLINK_SOCK_DIAG`,
//! the interface of `ss -x`) from inside the pod's network namespace, where
//! its unix sockets live; their owners from `/proc/PID/fd`.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::RawFd;
use std::path::Path;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{SOCK_SEQPACKET, SOCK_STREAM};
use netlink_packet_sock_diag::unix::{ShowFlags, StateFlags, UnixRequest};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket as NetlinkSocket, SocketAddr};

use crate::error::{Error, Result};
use crate::system::{netns, pidfd};

/// One end of a connection: the socket `inode`, open as `fd` in process
/// `pid` of container `container`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEnd {
    pub container: String,
    pub inode: u32,
    pub pid: i32,
    pub fd: RawFd,
}

/// A connected unix stream (or seqpacket) socket pair whose two ends are
/// open in two different containers of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixLink {
    pub ends: [LinkEnd; 2],
    /// Bytes waiting in the two ends' receive queues.
    pub queued: u64,
    /// A `SOCK_SEQPACKET` pair (otherwise `SOCK_STREAM`).
    pub seqpacket: bool,
}

/// A unix socket as sock_diag reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixSocket {
    pub inode: u32,
    pub peer: Option<u32>,
    pub queued: u32,
    pub seqpacket: bool,
}

/// The connections between the containers `members` (container, its
/// processes) of the pod whose network namespace is `netns`. A socket open
/// in two containers at once (passed from one to the other) is refused:
/// two dumps cannot both own it.
pub fn find(netns_path: &Path, members: &[(String, Vec<i32>)]) -> Result<Vec<UnixLink>> {
    let sockets = netns::in_netns(netns_path, connected_unix_sockets)?;
    links_among(&sockets, members)
}

/// [`find`] over a listing of the pod's connected sockets.
pub fn links_among(sockets: &[UnixSocket], members: &[(String, Vec<i32>)]) -> Result<Vec<UnixLink>> {
    // Each socket inode: the containers that have it open, and one (pid, fd).
    let mut owners: HashMap<u64, (BTreeSet<&str>, (i32, RawFd))> = HashMap::new();
    for (container, pids) in members {
        for &pid in pids {
            for (fd, inode) in pidfd::sockets_of(pid) {
                owners.entry(inode).or_insert_with(|| (BTreeSet::new(), (pid, fd))).0.insert(container);
            }
        }
    }
    let owner_of = |inode: u32| -> Result<Option<LinkEnd>> {
        let Some((containers, (pid, fd))) = owners.get(&u64::from(inode)) else { return Ok(None) };
        if containers.len() > 1 {
            let names: Vec<&str> = containers.iter().copied().collect();
            return Err(Error::FailedPrecondition(format!(
                "unix socket {inode} is open in containers {} at once: a socket shared between two containers cannot be checkpointed",
                names.join(" and ")
            )));
        }
        let container = containers.iter().next().map(|c| c.to_string()).unwrap_or_default();
        Ok(Some(LinkEnd { container, inode, pid: *pid, fd: *fd }))
    };
    let by_inode: HashMap<u32, &UnixSocket> = sockets.iter().map(|s| (s.inode, s)).collect();
    let mut links = Vec::new();
    for s in sockets {
        let Some(peer) = s.peer else { continue };
        // Each pair once, from its lower inode (a socket connected to itself is no link).
        if peer <= s.inode {
            continue;
        }
        let (Some(a), Some(b)) = (owner_of(s.inode)?, owner_of(peer)?) else { continue };
        if a.container == b.container {
            continue;
        }
        let queued = u64::from(s.queued) + by_inode.get(&peer).map_or(0, |p| u64::from(p.queued));
        links.push(UnixLink { ends: [a, b], queued, seqpacket: s.seqpacket });
    }
    Ok(links)
}

/// The connected unix stream and seqpacket sockets of this thread's
/// network namespace, with their peers and receive queues.
fn connected_unix_sockets() -> std::io::Result<Vec<UnixSocket>> {
    let mut socket = NetlinkSocket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::UnixRequest(UnixRequest {
            state_flags: StateFlags::ESTABLISHED,
            inode: 0,
            show_flags: ShowFlags::PEER | ShowFlags::RQLEN,
            cookie: [0; 8],
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
        let mut at = 0;
        while at < n {
            let msg = <NetlinkMessage<SockDiagMessage>>::deserialize(&recv[at..n])
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("sock_diag answer: {e}")))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r))
                    if r.header.kind == SOCK_STREAM || r.header.kind == SOCK_SEQPACKET =>
                {
                    out.push(UnixSocket {
                        inode: r.header.inode,
                        peer: r.peer().filter(|p| *p != 0),
                        queued: r.receive_queue_size().unwrap_or(0),
                        seqpacket: r.header.kind == SOCK_SEQPACKET,
                    });
                }
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return Err(std::io::Error::other(format!("sock_diag: {e}")));
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn inode_of(s: &UnixStream) -> u32 {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
        pidfd::socket_inode(&link).unwrap() as u32
    }

    /// sock_diag names a connected pair's peers and its queued bytes.
    #[test]
    fn sock_diag_lists_a_pair_with_its_queue() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"hello").unwrap();
        let all = connected_unix_sockets().unwrap();
        let (ia, ib) = (inode_of(&a), inode_of(&b));
        let sa = all.iter().find(|s| s.inode == ia).expect("a is listed");
        let sb = all.iter().find(|s| s.inode == ib).expect("b is listed");
        assert_eq!(sa.peer, Some(ib));
        assert_eq!(sb.peer, Some(ia));
        assert_eq!((sa.queued, sb.queued), (0, 5));
        drop((a, b));
    }

    /// Two "containers" that are this one process: a socket open in both
    /// is refused; one container's end alone is no link; the pair between
    /// "containers" keyed by pid would need two processes, so the pairing
    /// is checked on a listing.
    #[test]
    fn links_pair_ends_of_two_containers_only() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let me = std::process::id() as i32;
        let (ia, ib) = (inode_of(&a), inode_of(&b));
        let listing = [
            UnixSocket { inode: ia, peer: Some(ib), queued: 0, seqpacket: false },
            UnixSocket { inode: ib, peer: Some(ia), queued: 3, seqpacket: false },
        ];
        // One container holds both ends: nothing crosses.
        assert!(links_among(&listing, &[("app".into(), vec![me])]).unwrap().is_empty());
        // The same process in two containers: every socket is in both.
        let e = links_among(&listing, &[("app".into(), vec![me]), ("side".into(), vec![me])]).unwrap_err();
        assert!(e.to_string().contains("open in containers app and side at once"), "{e}");
        // Sockets of other processes (not members) are not links.
        assert!(links_among(&listing, &[("app".into(), vec![])]).unwrap().is_empty());
        a.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        b.read_exact(&mut one).unwrap();
    }

    /// A child process holds one end: the pair crosses two containers,
    /// with the queued bytes of both ends.
    #[tokio::test]
    #[allow(clippy::zombie_processes)] // the reaper waits for it
    async fn a_pair_across_two_processes_is_one_link() {
        use std::os::unix::process::CommandExt;
        let (mut a, b) = UnixStream::pair().unwrap();
        let (ia, ib) = (inode_of(&a), inode_of(&b));
        let raw = b.as_raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: dup2 is async-signal-safe; the child gets b as its fd 3.
        unsafe {
            cmd.pre_exec(move || if libc::dup2(raw, 3) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
        }
        // Waited for through the crate's reaper (its waitpid(-1) would
        // take the exit from under a std wait).
        let mut exits = crate::system::reaper::subscribe();
        let mut child = cmd.spawn().unwrap();
        drop(b);
        a.write_all(b"hi").unwrap();
        let me = std::process::id() as i32;
        let members = [("app".to_string(), vec![me]), ("side".to_string(), vec![child.id() as i32])];
        let listing = connected_unix_sockets().unwrap();
        let links = links_among(&listing, &members);
        child.kill().unwrap();
        exits.wait_for(child.id() as i32).await;
        let links = links.unwrap();
        assert_eq!(links.len(), 1, "{links:?}");
        let [x, y] = &links[0].ends;
        assert_eq!((x.container.as_str(), x.inode, x.pid), ("app", ia, me));
        assert_eq!((y.container.as_str(), y.inode, y.fd), ("side", ib, 3));
        assert_eq!(links[0].queued, 2);
    }
}
