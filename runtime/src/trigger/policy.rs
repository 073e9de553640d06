//! Triggers that come from the actor itself: its own request, made from
//! inside the container, and the idle policy (`torpor.dev/idle-after`).
//!
//! **Request.** Every app container gets a bind mount of the host directory
//! `/run/torpor/actors/<shim id>/` at `/run/torpor` (added to its OCI spec at
//! create). The actor writes `suspend` to `/run/torpor/request` when it is
//! done; the shim takes the request (removing the file) and suspends it. An
//! inbound connection, `crictl exec` or `torporctl resume` wakes it again.
//!
//! **Idle.** With `torpor.dev/idle-after: D`, the shim suspends the actor
//! once its containers used no CPU (less than 1% of one core) and its pod
//! network saw no packets (other than loopback) for D.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::actor::Lifecycle;
use crate::lifecycle::Actor;
use crate::oci::bundle::{request_dir, REQUEST_MOUNT};
use crate::system::cgroup::cpu_ns;

const POLL: Duration = Duration::from_secs(1);
/// CPU below this share of one core counts as idle (runtimes tick).
const IDLE_CPU_SHARE: f64 = 0.01;

/// Takes a pending `suspend` request of shim `group`, if there is one.
fn take_request(group: &str) -> Option<String> {
    let file = request_dir(group).join("request");
    let text = std::fs::read_to_string(&file).ok()?;
    let _ = std::fs::remove_file(&file);
    Some(text.trim().to_string())
}

/// What the idle policy samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_ns: u64,
    packets: u64,
}

/// Packets through the pod's interfaces (all but loopback).
fn packets(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    let mut total = 0u64;
    for line in text.lines().skip(2) {
        let (name, rest) = line.split_once(':')?;
        if name.trim() == "lo" {
            continue;
        }
        let f: Vec<u64> = rest.split_whitespace().filter_map(|v| v.parse().ok()).collect();
        // rx packets is field 1, tx packets field 9
        total += f.get(1).copied().unwrap_or(0) + f.get(9).copied().unwrap_or(0);
    }
    Some(total)
}

/// Polls the request file and the idle policy of shim `group`'s actor.
pub fn start(actor: &Actor, group: String) {
        let rt = actor.clone();
        tokio::spawn(async move {
            let mut last: Option<Sample> = None;
            let mut quiet_since = Instant::now();
            loop {
                tokio::time::sleep(POLL).await;
                let Some(rec) = rt.status() else { continue };
                if let Some(req) = take_request(&group) {
                    match req.as_str() {
                        "suspend" => match rt.suspend().await {
                            Ok(_) => info!(actor = rec.actor.as_str(), "suspended at the actor's request"),
                            Err(e) => warn!(actor = rec.actor.as_str(), "the actor's suspend request failed: {e}"),
                        },
                        other => warn!(actor = rec.actor.as_str(), "unknown request {other:?} in {REQUEST_MOUNT}/request (only \"suspend\")"),
                    }
                    continue;
                }
                let Some(idle_after) = rt.tasks.idle_after() else { continue };
                if rec.state != Lifecycle::Running {
                    last = None;
                    continue;
                }
                let Some(now) = sample(&rt) else { continue };
                let busy = match last {
                    Some(prev) => {
                        let cpu = now.cpu_ns.saturating_sub(prev.cpu_ns) as f64 / POLL.as_nanos() as f64;
                        cpu > IDLE_CPU_SHARE || now.packets != prev.packets
                    }
                    None => true,
                };
                last = Some(now);
                if busy {
                    quiet_since = Instant::now();
                } else if quiet_since.elapsed() >= idle_after {
                    match rt.suspend().await {
                        Ok(_) => info!(actor = rec.actor.as_str(), idle_after = ?idle_after, "suspended: idle"),
                        Err(e) => warn!(actor = rec.actor.as_str(), "idle suspend failed: {e}"),
                    }
                    last = None;
                    quiet_since = Instant::now();
                }
            }
        });
}

/// CPU and packets of the actor's containers, now.
fn sample(actor: &Actor) -> Option<Sample> {
    let mut s = Sample { cpu_ns: 0, packets: 0 };
    let mut any = false;
    for pid in actor.tasks.app_pids() {
        s.cpu_ns += cpu_ns(pid)?;
        s.packets = s.packets.max(packets(pid)?);
        any = true;
    }
    any.then_some(s)
}

