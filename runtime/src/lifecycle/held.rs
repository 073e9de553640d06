//! What stands in for a suspended actor on its network: the held ports
//! (listeners that wake it, [`crate::system::held_ports`]) and its kept
//! TCP connections ([`crate::system::sleeping_connections`]), and which
//! ports those are (its activation target). Steps shared by the dump,
//! the restore, the freeze tier and the actor's removal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::lifecycle::state::KeptConnections;
use crate::lifecycle::{lock, Actor};
use crate::system::held_ports;
use crate::system::netns::TcpConnection;
use crate::system::sleeping_connections;

impl Actor {
    /// Holds `ports` in `netns` for the suspended actor: a real connection
    /// wakes it ([`crate::trigger::activation`]).
    pub(crate) fn hold_ports(&self, netns: PathBuf, ports: Vec<SocketAddr>) {
        match held_ports::Armed::arm(&netns, ports.clone(), self.wake.clone()) {
            Ok(armed) => {
                *lock(&self.held) = Some(armed);
                *lock(&self.held_target) = Some((netns, ports));
            }
            Err(e) => warn!(netns = ?netns, "no activation on inbound connections: {e}"),
        }
    }

    /// Holds the ports of the last suspend again (after a failed resume).
    pub(crate) fn rearm_held_ports(&self) {
        let target = lock(&self.held_target).clone();
        if let Some((netns, ports)) = target {
            self.hold_ports(netns, ports);
        }
    }

    /// Nothing to wake any more (the suspended container was stopped):
    /// the held ports and the kept connections go.
    pub fn release_held_ports(&self) {
        let held = lock(&self.held).take();
        if let Some(armed) = held {
            armed.release();
        }
        lock(&self.held_target).take();
        self.release_connections();
    }

    /// Keeps the connections a suspend checkpointed (in `netns`), before
    /// the dump's network lock is lifted: their packets are dropped, not
    /// reset, and the first one wakes the actor. Without the watch of
    /// their packets they are not kept (a request would wait unanswered
    /// until the actor woke otherwise; a reset is the better answer).
    pub(crate) async fn keep_connections(&self, netns: &Path, conns: &[TcpConnection]) {
        if conns.is_empty() {
            return;
        }
        let watch = match sleeping_connections::Watch::start(netns, self.wake.clone()) {
            Ok(w) => w,
            Err(e) => {
                warn!(connections = conns.len(), "the suspended actor's connections are reset if their peers send: {e}");
                return;
            }
        };
        match sleeping_connections::keep(netns, conns).await {
            Ok(tools) => *lock(&self.kept) = Some(KeptConnections { netns: netns.to_path_buf(), tools, _watch: watch }),
            Err(e) => {
                warn!(connections = conns.len(), "the suspended actor's connections are reset if their peers send: {e}");
                if let Err(e) = sleeping_connections::release(netns, crate::system::netns::restore_tools()).await {
                    warn!("{e}");
                }
            }
        }
    }

    /// After a resume (or once nothing is to be woken): the kept
    /// connections' rules go, in the background (off the resume's path:
    /// a packet dropped meanwhile is retransmitted to the restored socket).
    pub(crate) fn release_connections(&self) {
        let Some(kept) = lock(&self.kept).take() else { return };
        let KeptConnections { netns, tools, _watch } = kept;
        drop(_watch);
        let release = move |ns: PathBuf| async move { sleeping_connections::release(&ns, &tools).await };
        crate::system::netns::remove_rules_later(netns, "release the resumed actor's connections", async {}, release);
    }

    /// The pod network namespace and the TCP ports to hold while suspended:
    /// `torpor.dev/activate-on`, or what the actor listens on now.
    pub(crate) fn activation_target(&self, ids: &[String]) -> (Option<PathBuf>, Vec<std::net::SocketAddr>) {
        let mut netns = None;
        let mut ports = Vec::new();
        for info in ids.iter().filter_map(|id| self.tasks.app_info(id).ok()) {
            netns = netns.or(info.netns);
            let pid = (info.pid > 0).then_some(info.pid);
            if pid.is_some() || info.actor.activate_on.is_some() {
                ports.extend(held_ports::listeners_for(pid, info.actor.activate_on.as_deref()));
            }
        }
        ports.sort_unstable();
        ports.dedup();
        (netns, ports)
    }
}
