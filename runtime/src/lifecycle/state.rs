//! What an actor holds besides its record, by the state it holds it in:
//! the commit of its last suspend, the held ports and kept connections of
//! a suspended actor, the watch of an actor in the freeze tier, the ends
//! of its containers' unix connections, the adoptions waiting for their
//! start. The steps that make and release them are in the files above
//! ([`super::dump`], [`super::held`], [`super::freezer`], [`super::links`],
//! [`super::adopt`]); this file imports none of them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use tracing::warn;

use crate::actor::identity::Identity;
use crate::actor::store_client::{Checkout, SnapshotRef};
use crate::system::held_ports::{self, Handover};
use crate::system::sleeping_connections;

/// The state of a background commit (see [`Actor::wait_commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitState {
    Running,
    Failed(String),
    Done,
}

/// The pod's network namespace and the addresses held there.
pub(crate) type HeldTarget = (PathBuf, Vec<SocketAddr>);

/// The pod netns whose rules keep a suspended actor's connections, and the
/// watch of their packets (stopped when dropped).
pub(crate) struct KeptConnections {
    pub(crate) netns: PathBuf,
    /// The xtables tools of the families that have rules.
    pub(crate) tools: Vec<&'static str>,
    pub(crate) _watch: sleeping_connections::Watch,
}

/// The frozen actor's own listeners, watched by the shim (see [`super::freezer`]).
pub struct FrozenWatch {
    pub(crate) armed: Option<held_ports::Armed>,
    /// One descriptor of each watched socket, with the file status flags
    /// the actor had on it, given back at [`FrozenWatch::release`].
    pub(crate) flags: Vec<(OwnedFd, libc::c_int)>,
}

impl FrozenWatch {
    /// Stops watching: every connection accepted so far is kept for the
    /// handover, the shim's listeners are closed, and the sockets get their
    /// own flags back.
    pub(crate) async fn release(mut self) -> Option<Handover> {
        let handover = match self.armed.take() {
            Some(a) => Some(a.begin_handover().await),
            None => None,
        };
        for (fd, flags) in self.flags.drain(..) {
            // SAFETY: F_SETFL on a descriptor we own.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
                warn!("freeze tier: give a listener back its flags: {}", std::io::Error::last_os_error());
            }
        }
        handover
    }
}

/// A container being restored by identity from a snapshot of the store
/// (between its create and its start).
#[derive(Debug, Clone)]
pub struct Adopted {
    pub identity: Identity,
    pub snapshot: SnapshotRef,
    /// The snapshot's verified files, pinned until the restore is done.
    pub checkout: Checkout,
    /// `<checkout>/<container name>`: the CRIU image.
    pub image: PathBuf,
}

/// Ends the shim holds, by (container name, socket inode).
pub(crate) type HeldEnds = HashMap<(String, u32), Arc<OwnedFd>>;
