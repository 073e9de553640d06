//! The unix connections between an actor's containers (an app and its
//! sidecar over a socket on a shared volume), kept across a suspend: the
//! pod is dumped as one unit.
//!
//! - **At the suspend**, once every container is frozen, the connections
//!   between two containers are found ([`unix_links::find`]). A connection
//!   with bytes in flight refuses the suspend (the actor keeps running, the
//!   next suspend tries again): no byte is lost. The shim takes a
//!   descriptor of each end (`pidfd_getfd`), so the connection itself
//!   outlives the processes. Each container's dump declares its ends
//!   external (`external unix[INODE]`), and its image directory gets
//!   [`LINKS_FILE`], which names them and their peers.
//! - **At the restore** of a container, each of its ends is given back
//!   (`inherit-fd`): the end the shim holds, which is the same connection;
//!   or, when the shim holds none (a restore into a new pod, on this node or
//!   another), one end of a new socket pair whose other end waits for the
//!   peer container's restore. The shim's descriptor goes once the
//!   container's processes have it, so that a process's exit still closes
//!   its end.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::actor::record::Record;
use crate::error::{Error, IoContext, Result};
use crate::lifecycle::state::HeldEnds;
use crate::lifecycle::{lock, name_of, Actor};
use crate::system::runc::InheritFd;
use crate::system::unix_links::{self, UnixLink};
use crate::system::{netns, pidfd};

/// The ends of a container's connections, in its image directory.
pub const LINKS_FILE: &str = "torpor-unix-links.json";
const LINKS_VERSION: u32 = 1;
/// More ends than this in one container is not a file torpor wrote.
const MAX_ENDS: usize = 1024;

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct LinksFile {
    version: u32,
    ends: Vec<EndRecord>,
}

/// One end of a connection in this container: its socket inode, and the
/// peer's container name and inode.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct EndRecord {
    inode: u32,
    seqpacket: bool,
    peer_container: String,
    peer_inode: u32,
}

impl Actor {
    /// The connections between the frozen containers `images` (id, image
    /// directory) of `rec`, in the pod's network namespace `netns`: each
    /// end held by the shim and written into its container's image
    /// directory. Returns each container's CRIU `external` resources. A pod
    /// of one container, or without a network namespace, has none.
    pub(crate) async fn take_links(
        &self,
        rec: &Record,
        netns: Option<&Path>,
        images: &[(String, PathBuf)],
    ) -> Result<HashMap<String, Vec<String>>> {
        self.forget_links();
        let mut externals = HashMap::new();
        let Some(netns) = netns.filter(|_| images.len() >= 2).map(Path::to_path_buf) else { return Ok(externals) };
        let members: Vec<(String, Vec<i32>)> =
            images.iter().map(|(id, _)| (name_of(rec, id).to_string(), self.processes_of(Some(rec), id))).collect();
        let links = tokio::task::spawn_blocking(move || unix_links::find(&netns, &members))
            .await
            .map_err(|e| Error::Io { context: "find the pod's unix connections".into(), source: std::io::Error::other(e) })??;
        if links.is_empty() {
            return Ok(externals);
        }
        for l in &links {
            if l.queued > 0 {
                return Err(Error::FailedPrecondition(format!(
                    "{} bytes are in flight on the unix connection between containers {} and {}: not suspended, so that none is lost (the next suspend tries again)",
                    l.queued, l.ends[0].container, l.ends[1].container
                )));
            }
        }
        let mut held = HeldEnds::new();
        for l in &links {
            for e in &l.ends {
                let fd = pidfd::open(e.pid)
                    .and_then(|p| pidfd::get_fd(&p, e.fd))
                    .io_context(|| format!("take unix socket {} of container {} (pid {}, fd {})", e.inode, e.container, e.pid, e.fd))?;
                held.insert((e.container.clone(), e.inode), Arc::new(fd));
            }
        }
        for (id, image) in images {
            let name = name_of(rec, id);
            let ends = ends_of(&links, name);
            if ends.is_empty() {
                continue;
            }
            write_links(image, &ends)?;
            externals.insert(id.clone(), ends.iter().map(|e| format!("unix[{}]", e.inode)).collect());
        }
        info!(actor = rec.actor.as_str(), connections = links.len(), "unix connections between the containers kept across the suspend");
        *lock(&self.links) = held;
        Ok(externals)
    }

    /// What the restore of container `id` (named `name`) from `image`
    /// inherits: each of its connection ends (see the module doc).
    pub(crate) fn link_fds(&self, id: &str, name: &str, image: &Path) -> Result<Vec<InheritFd>> {
        let Some(ends) = read_links(image)? else { return Ok(Vec::new()) };
        // A new pair is made in the pod's network namespace, where CRIU
        // looks for the sockets of the container's next dump.
        let netns = self.tasks.app_info(id)?.netns;
        let mut held = lock(&self.links);
        let mut out = Vec::with_capacity(ends.len());
        for e in ends {
            let fd = match held.get(&(name.to_string(), e.inode)) {
                Some(fd) => fd.clone(),
                None => {
                    let (mine, theirs) = socket_pair(netns.as_deref(), e.seqpacket)?;
                    debug!(
                        container = name,
                        inode = e.inode,
                        peer = e.peer_container.as_str(),
                        "a new connection for the restore (its peer end waits for its container)"
                    );
                    held.insert((e.peer_container.clone(), e.peer_inode), Arc::new(theirs));
                    let mine = Arc::new(mine);
                    held.insert((name.to_string(), e.inode), mine.clone());
                    mine
                }
            };
            out.push(InheritFd { resource: format!("socket:[{}]", e.inode), fd });
        }
        Ok(out)
    }

    /// Container `name`'s processes have their ends: the shim's go.
    pub(crate) fn links_restored(&self, name: &str) {
        lock(&self.links).retain(|(c, _), _| c != name);
    }

    /// The shim lets go of every end it holds.
    pub(crate) fn forget_links(&self) {
        lock(&self.links).clear();
    }
}

/// The ends in container `name` of `links`.
fn ends_of(links: &[UnixLink], name: &str) -> Vec<EndRecord> {
    let mut out = Vec::new();
    for l in links {
        for (me, peer) in [(&l.ends[0], &l.ends[1]), (&l.ends[1], &l.ends[0])] {
            if me.container == name {
                out.push(EndRecord {
                    inode: me.inode,
                    seqpacket: l.seqpacket,
                    peer_container: peer.container.clone(),
                    peer_inode: peer.inode,
                });
            }
        }
    }
    out
}

fn write_links(image: &Path, ends: &[EndRecord]) -> Result<()> {
    std::fs::create_dir_all(image).io_context(|| format!("create {image:?}"))?;
    let path = image.join(LINKS_FILE);
    let file = LinksFile { version: LINKS_VERSION, ends: ends.to_vec() };
    let text = serde_json::to_vec(&file).map_err(|source| Error::Json { context: format!("encode {path:?}"), source })?;
    std::fs::write(&path, text).io_context(|| format!("write {path:?}"))
}

/// The ends written in `image` (`None`: the container had none). The file
/// comes with a snapshot, maybe from a bucket: whatever is not what
/// [`write_links`] writes is refused, naming the file.
fn read_links(image: &Path) -> Result<Option<Vec<EndRecord>>> {
    let path = image.join(LINKS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).io_context(|| format!("read {path:?}")),
    };
    let bad = |why: String| Error::Corrupt(format!("{path:?}: {why}"));
    let file: LinksFile = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if file.version != LINKS_VERSION {
        return Err(bad(format!("version {} (this torpor reads {LINKS_VERSION})", file.version)));
    }
    if file.ends.len() > MAX_ENDS {
        return Err(bad(format!("{} ends (at most {MAX_ENDS})", file.ends.len())));
    }
    for e in &file.ends {
        let plain = !e.peer_container.is_empty() && e.peer_container.len() <= 256 && !e.peer_container.contains(['/', '\0']);
        if !plain {
            return Err(bad(format!("peer container {:?} is not a container name", e.peer_container)));
        }
    }
    Ok(Some(file.ends))
}

/// A new connected pair, made in network namespace `netns` (the shim's
/// own without one): the end of the restored container, the peer's.
fn socket_pair(netns: Option<&Path>, seqpacket: bool) -> Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let kind = if seqpacket { SockType::SeqPacket } else { SockType::Stream };
    let pair = move || socketpair(AddressFamily::Unix, kind, None, SockFlag::SOCK_CLOEXEC).map_err(std::io::Error::from);
    match netns {
        Some(ns) => netns::in_netns(ns, pair).map_err(|e| e.context("create a unix socket pair for a restored connection")),
        None => pair().io_context(|| "create a unix socket pair for a restored connection".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::unix_links::LinkEnd;

    fn end(container: &str, inode: u32) -> LinkEnd {
        LinkEnd { container: container.into(), inode, pid: 1, fd: 3 }
    }

    #[test]
    fn each_container_gets_its_ends_and_reads_them_back() {
        let links = [
            UnixLink { ends: [end("app", 10), end("side", 11)], queued: 0, seqpacket: false },
            UnixLink { ends: [end("side", 20), end("app", 21)], queued: 0, seqpacket: true },
        ];
        let app = ends_of(&links, "app");
        assert_eq!(
            app,
            vec![
                EndRecord { inode: 10, seqpacket: false, peer_container: "side".into(), peer_inode: 11 },
                EndRecord { inode: 21, seqpacket: true, peer_container: "side".into(), peer_inode: 20 },
            ]
        );
        assert!(ends_of(&links, "other").is_empty());
        let dir = tempfile::tempdir().unwrap();
        write_links(dir.path(), &app).unwrap();
        assert_eq!(read_links(dir.path()).unwrap(), Some(app));
        let none = tempfile::tempdir().unwrap();
        assert_eq!(read_links(none.path()).unwrap(), None);
    }

    /// A hostile image: every bad file is refused with its name and why.
    #[test]
    fn a_bad_links_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LINKS_FILE);
        for (text, why) in [
            ("{", "EOF"),
            (r#"{"version":2,"ends":[]}"#, "version 2"),
            (r#"{"version":1,"ends":[{"inode":1,"seqpacket":false,"peer_container":"../x","peer_inode":2}]}"#, "not a container name"),
            (r#"{"version":1,"ends":[{"inode":1,"seqpacket":false,"peer_container":"","peer_inode":2}]}"#, "not a container name"),
            (r#"{"version":1,"ends":[],"extra":1}"#, "unknown field"),
            (r#"{"version":1,"ends":[{"inode":-1,"seqpacket":false,"peer_container":"a","peer_inode":2}]}"#, "invalid value"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_links(dir.path()).unwrap_err().to_string();
            assert!(e.contains(LINKS_FILE) && e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_new_pair_is_connected() {
        use std::io::{Read, Write};
        for seqpacket in [false, true] {
            let (a, b) = socket_pair(None, seqpacket).unwrap();
            let mut a = std::os::unix::net::UnixStream::from(a);
            let mut b = std::os::unix::net::UnixStream::from(b);
            a.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            b.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping");
        }
    }
}
