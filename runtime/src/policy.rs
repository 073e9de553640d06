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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::{info, warn};
use serde_json::{json, Value};

use crate::actor::Lifecycle;
use crate::container::Runtime;
use crate::error::{Error, IoContext, Result};

/// Host directory of the in-container request files.
pub const REQUEST_ROOT: &str = "/run/torpor/actors";
/// Where it appears inside the container.
pub const REQUEST_MOUNT: &str = "/run/torpor";
const POLL: Duration = Duration::from_secs(1);
/// CPU below this share of one core counts as idle (runtimes tick).
const IDLE_CPU_SHARE: f64 = 0.01;

/// The host side of the request directory of shim `group`.
pub fn request_dir(group: &str) -> PathBuf {
    Path::new(REQUEST_ROOT).join(group)
}

/// CRIU options for the dumps of app containers (runc reads the file named
/// by the `org.criu.config` annotation): a connection still in the listen
/// backlog must not make a suspend fail; the client sees it reset, as if the
/// server had restarted.
const CRIU_CONFIG: &str = "skip-in-flight\n";

/// Adapts an app container's `config.json`: the request directory bind
/// mount, and torpor's CRIU configuration.
pub fn adapt_spec(bundle: &Path, group: &str) -> Result<()> {
    let dir = request_dir(group);
    std::fs::create_dir_all(&dir).io_context(|| format!("create {dir:?}"))?;
    let criu_conf = Path::new(REQUEST_ROOT).with_file_name("criu.conf");
    if std::fs::read_to_string(&criu_conf).ok().as_deref() != Some(CRIU_CONFIG) {
        std::fs::write(&criu_conf, CRIU_CONFIG).io_context(|| format!("write {criu_conf:?}"))?;
    }
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).io_context(|| format!("read {path:?}"))?;
    let mut spec: Value = serde_json::from_slice(&text).map_err(|source| Error::Json {
        context: format!("parse {path:?}"),
        source,
    })?;
    let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
        return Err(Error::InvalidArgument(format!("{path:?} has no mounts list")));
    };
    if !mounts.iter().any(|m| m["destination"] == REQUEST_MOUNT) {
        mounts.push(json!({
            "destination": REQUEST_MOUNT,
            "type": "bind",
            "source": dir,
            "options": ["rbind", "rw", "nosuid", "nodev", "noexec"],
        }));
    }
    if let Some(obj) = spec.as_object_mut() {
        let ann = obj.entry("annotations").or_insert_with(|| json!({}));
        if let Some(ann) = ann.as_object_mut() {
            ann.entry("org.criu.config").or_insert_with(|| json!(criu_conf));
        }
    }
    write_spec(bundle, &path, &spec)
}

/// CRIU options added for the restore of a checkpoint a dead shim kept into
/// a new pod: its established TCP connections were bound to the old pod's
/// IP, which the new pod does not have; they come back closed (the peers
/// saw them end with the old pod).
const CRIU_RECOVERY: &str = "tcp-close\n";

/// The per-container CRIU configuration of a container restored from a
/// kept checkpoint: `org.criu.config` points to it (when it pointed to
/// torpor's), with [`CRIU_RECOVERY`] while `restoring`, without it after
/// (the container's later dumps keep their connections).
pub fn recovery_criu_config(bundle: &Path, restoring: bool) -> Result<()> {
    let own = bundle.join("criu-recovery.conf");
    if !restoring {
        if own.exists() {
            std::fs::write(&own, CRIU_CONFIG).io_context(|| format!("write {own:?}"))?;
        }
        return Ok(());
    }
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).io_context(|| format!("read {path:?}"))?;
    let mut spec: Value = serde_json::from_slice(&text).map_err(|source| Error::Json {
        context: format!("parse {path:?}"),
        source,
    })?;
    let global = Path::new(REQUEST_ROOT).with_file_name("criu.conf");
    let ann = &mut spec["annotations"]["org.criu.config"];
    if ann.as_str() != Some(&*global.to_string_lossy()) {
        return Ok(()); // the user's own CRIU configuration: left alone
    }
    std::fs::write(&own, format!("{CRIU_CONFIG}{CRIU_RECOVERY}")).io_context(|| format!("write {own:?}"))?;
    *ann = json!(own);
    write_spec(bundle, &path, &spec)
}

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

fn cpu_ns(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if ctrl.split(',').any(|c| c == "cpuacct") {
            let f = Path::new("/sys/fs/cgroup/cpuacct").join(rel).join("cpuacct.usage");
            if let Ok(v) = std::fs::read_to_string(&f) {
                return v.trim().parse().ok();
            }
            let f = Path::new("/sys/fs/cgroup/cpu,cpuacct").join(rel).join("cpuacct.usage");
            return std::fs::read_to_string(f).ok()?.trim().parse().ok();
        }
        if ctrl.is_empty() {
            let stat = std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(rel).join("cpu.stat")).ok();
            if let Some(us) = stat.as_deref().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec ").and_then(|v| v.trim().parse::<u64>().ok()))
            }) {
                return Some(us * 1000);
            }
        }
    }
    None
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

impl Runtime {
    /// Polls the request file and the idle policy of shim `group`.
    pub fn start_policy(&self, group: String) {
        let rt = self.clone();
        tokio::spawn(async move {
            let mut last: Option<Sample> = None;
            let mut quiet_since = Instant::now();
            loop {
                tokio::time::sleep(POLL).await;
                let Some(rec) = rt.actor_status().await else { continue };
                if let Some(req) = take_request(&group) {
                    match req.as_str() {
                        "suspend" => match rt.suspend().await {
                            Ok(_) => info!(actor = rec.actor.as_str(); "suspended at the actor's request"),
                            Err(e) => warn!(actor = rec.actor.as_str(); "the actor's suspend request failed: {e}"),
                        },
                        other => warn!(actor = rec.actor.as_str(); "unknown request {other:?} in {REQUEST_MOUNT}/request (only \"suspend\")"),
                    }
                    continue;
                }
                let Some(idle_after) = rt.idle_after().await else { continue };
                if rec.state != Lifecycle::Running {
                    last = None;
                    continue;
                }
                let Some(now) = rt.sample().await else { continue };
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
                        Ok(_) => info!(actor = rec.actor.as_str(), idle_after:? = idle_after; "suspended: idle"),
                        Err(e) => warn!(actor = rec.actor.as_str(); "idle suspend failed: {e}"),
                    }
                    last = None;
                    quiet_since = Instant::now();
                }
            }
        });
    }

    async fn idle_after(&self) -> Option<Duration> {
        let inner = self.inner.lock().await;
        inner.containers.values().filter(|c| !c.sandbox).filter_map(|c| c.actor.idle_after).min()
    }

    async fn sample(&self) -> Option<Sample> {
        let inner = self.inner.lock().await;
        let mut s = Sample { cpu_ns: 0, packets: 0 };
        let mut any = false;
        for c in inner.containers.values().filter(|c| !c.sandbox && c.init.pid > 0) {
            s.cpu_ns += cpu_ns(c.init.pid)?;
            s.packets = s.packets.max(packets(c.init.pid)?);
            any = true;
        }
        any.then_some(s)
    }
}

/// Replaces the bundle's config.json (`path`) with `spec` (tmp file + rename).
fn write_spec(bundle: &Path, path: &Path, spec: &Value) -> Result<()> {
    let tmp = bundle.join(".config.json.tmp");
    let out = serde_json::to_vec(spec).map_err(|source| Error::Json {
        context: "encode config.json".into(),
        source,
    })?;
    std::fs::write(&tmp, out).io_context(|| format!("write {tmp:?}"))?;
    std::fs::rename(&tmp, path).io_context(|| format!("rename {tmp:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_mount_is_added_once() {
        let b = tempfile::tempdir().unwrap();
        std::fs::write(b.path().join("config.json"), r#"{"ociVersion":"1.2.0","mounts":[{"destination":"/proc","type":"proc","source":"proc"}],"x":1}"#).unwrap();
        let group = format!("unit-test-{}", std::process::id());
        adapt_spec(b.path(), &group).unwrap();
        adapt_spec(b.path(), &group).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(b.path().join("config.json")).unwrap()).unwrap();
        let mounts = v["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[1]["destination"], REQUEST_MOUNT);
        assert_eq!(v["x"], 1);
        assert_eq!(v["annotations"]["org.criu.config"], "/run/torpor/criu.conf");
        let _ = std::fs::remove_dir_all(request_dir(&group));
    }
}
