//! Triggers that come from the actor itself: its own request, made from
//! inside the container, and the idle policy (`torpor.dev/idle-after`).
//!
//! **Request.** Every app container gets a bind mount of the host directory
//! `/run/torpor/actors/<shim id>/` at `/run/torpor` (added to its OCI spec at
//! create; a tmpfs of its own, 4 KiB and 8 inodes, see
//! [`crate::oci::bundle`]). The actor writes `suspend` to
//! `/run/torpor/request` when it is done; the shim takes the request
//! (removing the file) and suspends it. An inbound connection, `crictl
//! exec` or `torporctl resume` wakes it again.
//!
//! The file is written by the container, read by the shim as root: it is
//! opened without following a symlink and without blocking (a FIFO), taken
//! only when it is a regular file, read for at most [`REQUEST_MAX`] bytes,
//! removed whatever it was, and its contents are never logged (an unknown
//! request is reported by its size).
//!
//! **Idle.** With `torpor.dev/idle-after: D`, the shim suspends the actor
//! once its containers used no CPU (less than 1% of one core) and its pod
//! network saw no activity for D. kubelet's probes are no activity, so a
//! probe period shorter than D does not keep the actor awake; a real
//! client does, wherever it connects from (the node itself too, the
//! address kubelet probes from). Activity is, in the pod's network
//! namespace, on every interface but `lo`, in both directions
//! ([`crate::system::activity`], counted by iptables rules that log to an
//! NFLOG group the shim listens on: no process per poll):
//!
//! - any packet that is not TCP (a UDP datagram, a ping), but IPv6
//!   neighbour discovery and multicast listener messages;
//! - a TCP packet with payload (4 bytes or more) of a connection whose
//!   initiator sent payload first and that is not an HTTP probe: a TCP
//!   probe (a connect and a close) carries none, nor does the greeting a
//!   server that speaks first sends to a connection that never sends; an
//!   HTTP probe is a connection whose request carries
//!   `User-Agent: kube-probe/` (its answer and later packets are skipped
//!   too). The actor's own connections (to a database...) count as ever.
//!
//! Not recognised as probes (counted as activity): gRPC probes (their user
//! agent is HPACK-encoded), HTTPS probes, an HTTP probe with a custom
//! `User-Agent` header. Exec probes cost CPU only (less than 1% of a core
//! between probes: no activity). The rules go in in the background once
//! the actor runs with `idle-after`, are checked after each resume (and put
//! in again where a restore lost them), and come out when the actor goes.
//! A pod without its own network namespace, or a kernel that lacks a match
//! the rules need (`string`, `u32`, `connmark`, `NFLOG`...), falls back to
//! counting every packet (other than loopback), kubelet's too, with a
//! warning naming why.
//!
//! **The freeze tier's window and memory pressure.** An actor that a
//! suspend froze in the freeze tier (`torpor.dev/freeze-first: W`, see
//! [`crate::lifecycle::freeze`]) is checkpointed when W ends — a timer on
//! the window's end, woken when the tier begins or ends — or earlier when
//! the node is short of memory, checked every [`PRESSURE_POLL`] while the
//! actor is frozen there. Pressure is either of ([`Pressure`], from the
//! shim's environment, which containerd passes on):
//!
//! - PSI: `some avg10` of `/proc/pressure/memory` at or above
//!   `TORPOR_FREEZE_PSI_SOME_AVG10` percent (default 10; `off`); skipped on
//!   a kernel without PSI;
//! - `MemAvailable` of `/proc/meminfo` below `TORPOR_FREEZE_MIN_AVAILABLE`,
//!   `N%` of `MemTotal` or `NMiB` (default `10%`; `off`).
//!
//! An invalid value is logged as an error naming the variable, and the
//! default is used. The test hook: the failpoint `freeze-pressure`
//! ([`crate::failpoint::FREEZE_PRESSURE`], `failpoints` builds only) makes
//! the `MemAvailable` threshold unbounded, so the real reading trips it.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use crate::actor::record::{now_ms, FreezeTier, Record};
use crate::actor::report::Trigger;
use crate::actor::Lifecycle;
use crate::error::{Error, Result};
use crate::failpoint;
use crate::lifecycle::Actor;
use crate::oci::bundle::{request_dir, REQUEST_MOUNT};
use crate::system::activity::Activity;
use crate::system::cgroup::cpu_ns;

const POLL: Duration = Duration::from_secs(1);
/// CPU below this share of one core counts as idle (runtimes tick).
const IDLE_CPU_SHARE: f64 = 0.01;

/// The longest request read from the file; a longer one is unknown.
const REQUEST_MAX: u64 = 16;

/// A request found in the request file.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Suspend,
    /// Anything else: only its size is told (never its contents).
    Unknown {
        bytes: u64,
    },
    /// A symlink, FIFO, directory or device: ignored.
    NotAFile,
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Suspend => f.write_str("suspend"),
            Request::Unknown { bytes } => write!(f, "unknown request ({bytes} bytes) in {REQUEST_MOUNT}/request (only \"suspend\")"),
            Request::NotAFile => write!(f, "{REQUEST_MOUNT}/request is not a regular file: ignored and removed"),
        }
    }
}

/// Takes a pending request of shim `group`, if there is one.
fn take_request(group: &str) -> Option<Request> {
    take_request_in(&request_dir(group))
}

/// Takes (reads and removes) the request file in `dir`.
fn take_request_in(dir: &Path) -> Option<Request> {
    let file = dir.join("request");
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&file);
    let request = match opened {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        // ELOOP (a symlink), EACCES (a device on a nodev mount)...
        Err(_) => Request::NotAFile,
        Ok(f) => match f.metadata() {
            Ok(md) if md.is_file() => {
                let mut head = Vec::new();
                match (&f).take(REQUEST_MAX + 1).read_to_end(&mut head) {
                    Ok(n) if n as u64 <= REQUEST_MAX && head.trim_ascii() == b"suspend" => Request::Suspend,
                    _ => Request::Unknown { bytes: md.len() },
                }
            }
            _ => Request::NotAFile,
        },
    };
    // Whatever it was, it goes (a directory with what is in it).
    if std::fs::remove_file(&file).is_err() {
        let _ = std::fs::remove_dir_all(&file);
    }
    Some(request)
}

/// What the idle policy samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_ns: u64,
    /// The pod network's activity so far: counted by the activity rules,
    /// or packets (see [`Net`]).
    net: Net,
}

/// How the pod network's activity is counted, and how much so far.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Net {
    /// By the activity rules ([`crate::system::activity`]): probes skipped.
    Activity(u64),
    /// Packets through the pod's interfaces (all but loopback).
    Packets(u64),
}

/// Whether the actor was busy between samples `prev` and `now`, `poll`
/// apart: CPU above [`IDLE_CPU_SHARE`] of one core, or network activity
/// (a change of how it is counted counts as activity).
fn busy(prev: &Sample, now: &Sample, poll: Duration) -> bool {
    let cpu = now.cpu_ns.saturating_sub(prev.cpu_ns) as f64 / poll.as_nanos() as f64;
    cpu > IDLE_CPU_SHARE || now.net != prev.net
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

/// Polls the request file and the idle policy of shim `group`'s actor,
/// and runs the freeze tier's window timer and pressure check.
pub fn start(actor: &Actor, group: String) {
    start_freeze_window(actor, group.clone(), Pressure::from_env());
    let rt = actor.clone();
    tokio::spawn(async move {
        let mut last: Option<Sample> = None;
        let mut quiet_since = Instant::now();
        let activity = Activity::new();
        let mut was_running = false;
        loop {
            tokio::time::sleep(POLL).await;
            let Some(rec) = rt.status() else {
                // The actor went: its activity rules go.
                activity.keep(None, false);
                was_running = false;
                continue;
            };
            if let Some(req) = take_request(&group) {
                match req {
                    Request::Suspend => match rt.suspend(Trigger::Request).await {
                        Ok(_) => info!(actor = rec.actor.as_str(), "suspended at the actor's request"),
                        Err(e) => warn!(actor = rec.actor.as_str(), "the actor's suspend request failed: {e}"),
                    },
                    other => warn!(actor = rec.actor.as_str(), "{other}"),
                }
                continue;
            }
            let Some(idle_after) = rt.tasks.idle_after() else {
                activity.keep(None, false);
                continue;
            };
            let running = rec.state == Lifecycle::Running;
            // Kept in the pod's netns while the actor lives (through its
            // suspends), checked again once it runs after one.
            activity.keep(pod_netns(&rt).as_deref(), running && !was_running);
            was_running = running;
            if !running {
                last = None;
                continue;
            }
            let Some(now) = sample(&rt, &activity) else { continue };
            let busy = last.as_ref().is_none_or(|prev| busy(prev, &now, POLL));
            last = Some(now);
            if busy {
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= idle_after {
                match rt.suspend(Trigger::Idle).await {
                    Ok(_) => info!(actor = rec.actor.as_str(), idle_after = ?idle_after, "suspended: idle"),
                    Err(e) => warn!(actor = rec.actor.as_str(), "idle suspend failed: {e}"),
                }
                last = None;
                quiet_since = Instant::now();
            }
        }
    });
}

/// How often the node's memory pressure is read while an actor is frozen
/// in the freeze tier.
pub const PRESSURE_POLL: Duration = Duration::from_secs(1);
/// After a checkpoint of the freeze tier failed without leaving it (the
/// actor is thawed otherwise), the next attempt waits this long.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub const PSI_ENV: &str = "TORPOR_FREEZE_PSI_SOME_AVG10";
pub const MIN_AVAILABLE_ENV: &str = "TORPOR_FREEZE_MIN_AVAILABLE";
const PSI_DEFAULT: f64 = 10.0;
const MIN_AVAILABLE_DEFAULT: MinAvailable = MinAvailable::Percent(10.0);

/// `TORPOR_FREEZE_MIN_AVAILABLE`: a share of `MemTotal` or a size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MinAvailable {
    Percent(f64),
    Mib(u64),
}

/// When the node counts as short of memory (see the module doc); `None`
/// turns a check off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    pub psi_some_avg10: Option<f64>,
    pub min_available: Option<MinAvailable>,
}

impl Pressure {
    /// From the shim's environment.
    pub fn from_env() -> Pressure {
        let var = |k: &str| std::env::var(k).ok();
        Pressure::parse(var(PSI_ENV).as_deref(), var(MIN_AVAILABLE_ENV).as_deref(), |e| error!("{e}"))
    }

    /// From the variables' values (`None`: unset); an invalid one is
    /// reported through `bad` and its default used.
    pub fn parse(psi: Option<&str>, min_available: Option<&str>, mut bad: impl FnMut(String)) -> Pressure {
        let psi_some_avg10 = match psi.map(str::trim) {
            None | Some("") => Some(PSI_DEFAULT),
            Some("off") => None,
            Some(v) => match v.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => Some(p),
                _ => {
                    bad(format!("{PSI_ENV}={v:?} is not a percentage (0 to 100) or \"off\": using {PSI_DEFAULT}"));
                    Some(PSI_DEFAULT)
                }
            },
        };
        let min_available = match min_available.map(str::trim) {
            None | Some("") => Some(MIN_AVAILABLE_DEFAULT),
            Some("off") => None,
            Some(v) => {
                let parsed = if let Some(p) = v.strip_suffix('%') {
                    p.trim().parse::<f64>().ok().filter(|p| (0.0..=100.0).contains(p)).map(MinAvailable::Percent)
                } else if let Some(m) = v.strip_suffix("MiB") {
                    m.trim().parse::<u64>().ok().map(MinAvailable::Mib)
                } else {
                    None
                };
                parsed.or_else(|| {
                    bad(format!("{MIN_AVAILABLE_ENV}={v:?} is not \"N%\" (of MemTotal), \"NMiB\" or \"off\": using 10%"));
                    Some(MIN_AVAILABLE_DEFAULT)
                })
            }
        };
        Pressure { psi_some_avg10, min_available }
    }

    /// Why the node is short of memory, from the text of
    /// `/proc/pressure/memory` (`None`: no PSI) and `/proc/meminfo`; with
    /// `forced` (the test hook) the `MemAvailable` threshold is unbounded.
    pub fn check(&self, psi: Option<&str>, meminfo: Option<&str>, forced: bool) -> Option<String> {
        if let (Some(limit), Some(avg10)) = (self.psi_some_avg10, psi.and_then(psi_some_avg10)) {
            if avg10 >= limit {
                return Some(format!("memory pressure: PSI some avg10 {avg10:.2}% >= {limit}% ({PSI_ENV})"));
            }
        }
        let min = if forced { Some(MinAvailable::Mib(u64::MAX)) } else { self.min_available };
        let (Some(min), Some(text)) = (min, meminfo) else { return None };
        let (Some(avail_kib), total_kib) = (meminfo_kib(text, "MemAvailable"), meminfo_kib(text, "MemTotal")) else { return None };
        let threshold_kib = match min {
            MinAvailable::Mib(m) => m.saturating_mul(1024),
            MinAvailable::Percent(p) => (total_kib? as f64 * p / 100.0) as u64,
        };
        (avail_kib < threshold_kib).then(|| {
            let limit = if forced {
                "unbounded (test hook freeze-pressure)".to_string()
            } else {
                format!("{} MiB ({MIN_AVAILABLE_ENV})", threshold_kib / 1024)
            };
            format!("memory pressure: MemAvailable {} MiB below {limit}", avail_kib / 1024)
        })
    }

    /// The node's pressure now, for shim `group` (its test hook).
    fn now(&self, group: &str) -> Option<String> {
        let psi = std::fs::read_to_string("/proc/pressure/memory").ok();
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
        self.check(psi.as_deref(), meminfo.as_deref(), failpoint::armed(group, failpoint::FREEZE_PRESSURE))
    }
}

/// `some avg10=` of a PSI file.
fn psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace().find_map(|f| f.strip_prefix("avg10=")).and_then(|v| v.parse().ok())
}

/// A `/proc/meminfo` field in KiB.
fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// What the window timer does now with the freeze tier `tier` at `now_ms`:
/// wait (how long at most), or checkpoint (what triggers it, why).
#[derive(Debug, PartialEq)]
enum WindowStep {
    Wait(Duration),
    Checkpoint(Trigger, String),
}

fn window_step(tier: FreezeTier, now_ms: u64, pressure: impl FnOnce() -> Option<String>) -> WindowStep {
    let left = tier.left(now_ms);
    if left.is_zero() {
        return WindowStep::Checkpoint(Trigger::FreezeWindow, "the freeze-first window ended".into());
    }
    match pressure() {
        Some(why) => WindowStep::Checkpoint(Trigger::Pressure, format!("{why}: checkpointed before the freeze-first window ended")),
        None => WindowStep::Wait(left.min(PRESSURE_POLL)),
    }
}

/// The freeze tier's window timer and pressure check of shim `group`'s actor.
fn start_freeze_window(actor: &Actor, group: String, pressure: Pressure) {
    let rt = actor.clone();
    tokio::spawn(async move {
        let changed = rt.freeze_changed();
        loop {
            // Created before the tier is read: a change in between wakes it.
            let notified = changed.notified();
            let Some(tier) = rt.freeze_tier() else {
                notified.await;
                continue;
            };
            match window_step(tier, now_ms(), || pressure.now(&group)) {
                WindowStep::Wait(d) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(d) => {}
                    }
                }
                WindowStep::Checkpoint(trigger, why) => match end_freeze_tier(&rt, tier, trigger, &why).await {
                    Ok(rec) => info!(actor = rec.actor.as_str(), why = why.as_str(), "freeze tier: checkpointed"),
                    Err(Error::WrongState(m)) => debug!("freeze tier: nothing to checkpoint: {m}"),
                    Err(e) => {
                        warn!(why = why.as_str(), "freeze tier: the checkpoint failed: {e}");
                        tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                    }
                },
            }
        }
    });
}

/// The checkpoint that ends the freeze tier window `tier` (its end, or
/// memory pressure: `trigger`, `why`). `WrongState` when the actor left
/// that window meanwhile (thawed, checkpointed).
async fn end_freeze_tier(actor: &Actor, tier: FreezeTier, trigger: Trigger, why: &str) -> Result<Record> {
    info!(why, "freeze tier: checkpointing the frozen actor");
    actor.checkpoint(Some(tier), trigger).await
}

/// CPU of the actor's containers and its pod network's activity, now:
/// counted by `activity`'s rules where they are in, else packets.
fn sample(actor: &Actor, activity: &Activity) -> Option<Sample> {
    let mut cpu = 0;
    let mut packets_seen = 0;
    let mut any = false;
    for pid in actor.tasks.app_pids() {
        cpu += cpu_ns(pid)?;
        packets_seen = packets_seen.max(packets(pid)?);
        any = true;
    }
    let net = match activity.count() {
        Some(n) => Net::Activity(n),
        None => Net::Packets(packets_seen),
    };
    any.then_some(Sample { cpu_ns: cpu, net })
}

/// The pod's network namespace (of its first app container that has one
/// of its own; a pod on the host's network has none).
fn pod_netns(actor: &Actor) -> Option<PathBuf> {
    actor.tasks.app_containers().iter().find_map(|id| actor.tasks.app_info(id).ok()?.netns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    const MEMINFO: &str = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:    3000000 kB\n";
    const PSI: &str = "some avg10=12.50 avg60=0.26 avg300=0.49 total=11611018\nfull avg10=1.00 avg60=0.23 avg300=0.43 total=8966707\n";

    #[test]
    fn pressure_configuration() {
        let mut bad = Vec::new();
        let p = Pressure::parse(None, None, |e| bad.push(e));
        assert_eq!(p, Pressure { psi_some_avg10: Some(10.0), min_available: Some(MinAvailable::Percent(10.0)) });
        assert_eq!(Pressure::parse(Some("off"), Some("off"), |e| bad.push(e)), Pressure { psi_some_avg10: None, min_available: None });
        assert_eq!(Pressure::parse(Some("25"), Some("512MiB"), |e| bad.push(e)).min_available, Some(MinAvailable::Mib(512)));
        assert_eq!(Pressure::parse(Some(" 2.5 "), Some("5%"), |e| bad.push(e)).psi_some_avg10, Some(2.5));
        assert!(bad.is_empty(), "{bad:?}");
        // Invalid values are told, naming the variable, and the default used.
        let p = Pressure::parse(Some("lots"), Some("2GB"), |e| bad.push(e));
        assert_eq!(p, Pressure::parse(None, None, |_| {}));
        assert_eq!(bad.len(), 2);
        assert!(bad[0].contains(PSI_ENV) && bad[1].contains(MIN_AVAILABLE_ENV), "{bad:?}");
        for v in ["101", "-1", "150%", "x%"] {
            let mut n = 0;
            Pressure::parse(Some(v), Some(v), |_| n += 1);
            assert_eq!(n, 2, "{v}");
        }
    }

    #[test]
    fn pressure_readings() {
        assert_eq!(psi_some_avg10(PSI), Some(12.5));
        assert_eq!(meminfo_kib(MEMINFO, "MemAvailable"), Some(3_000_000));
        assert_eq!(meminfo_kib(MEMINFO, "MemTotal"), Some(24_000_000));
        assert_eq!(meminfo_kib(MEMINFO, "Mem"), None);
        let off = Pressure::parse(Some("off"), Some("off"), |_| {});
        assert_eq!(off.check(Some(PSI), Some(MEMINFO), false), None);
        // PSI at or above its threshold.
        let psi = Pressure { psi_some_avg10: Some(12.5), min_available: None };
        assert!(psi.check(Some(PSI), Some(MEMINFO), false).unwrap().contains("PSI some avg10 12.50%"));
        assert_eq!(Pressure { psi_some_avg10: Some(13.0), ..psi }.check(Some(PSI), Some(MEMINFO), false), None);
        assert_eq!(psi.check(None, Some(MEMINFO), false), None, "no PSI on this kernel");
        // MemAvailable 2929 MiB: below 15% of 24 GB, not below 10%.
        let pct = |p| Pressure { psi_some_avg10: None, min_available: Some(MinAvailable::Percent(p)) };
        assert!(pct(15.0).check(None, Some(MEMINFO), false).unwrap().contains("MemAvailable 2929 MiB below 3515 MiB"));
        assert_eq!(pct(10.0).check(None, Some(MEMINFO), false), None);
        let mib = |m| Pressure { psi_some_avg10: None, min_available: Some(MinAvailable::Mib(m)) };
        assert!(mib(3000).check(None, Some(MEMINFO), false).is_some());
        assert_eq!(mib(2000).check(None, Some(MEMINFO), false), None);
        // The test hook trips on the real reading, whatever the config.
        assert!(off.check(None, Some(MEMINFO), true).unwrap().contains("test hook"));
        assert_eq!(off.check(None, None, true), None, "nothing read, nothing tripped");
    }

    #[test]
    fn the_window_timer() {
        let tier = FreezeTier::starting(10_000, Duration::from_millis(2_500));
        // Inside the window: wait for its end, at most a pressure poll.
        assert_eq!(window_step(tier, 10_000, || None), WindowStep::Wait(PRESSURE_POLL));
        assert_eq!(window_step(tier, 12_000, || None), WindowStep::Wait(Duration::from_millis(500)));
        // Its end, even under pressure; pressure before it.
        match window_step(tier, 12_500, || panic!("pressure is not read once the window ended")) {
            WindowStep::Checkpoint(trigger, why) => assert!(trigger == Trigger::FreezeWindow && why.contains("window ended"), "{why}"),
            w => panic!("{w:?}"),
        }
        match window_step(tier, 10_001, || Some("memory pressure: x".into())) {
            WindowStep::Checkpoint(trigger, why) => {
                assert!(trigger == Trigger::Pressure && why.starts_with("memory pressure: x") && why.contains("before"), "{why}")
            }
            w => panic!("{w:?}"),
        }
        assert!(matches!(window_step(tier, 99_999, || None), WindowStep::Checkpoint(Trigger::FreezeWindow, _)));
    }

    #[test]
    fn idle_is_no_cpu_and_no_network_activity() {
        let s = |cpu_ns, net| Sample { cpu_ns, net };
        let poll = Duration::from_secs(1);
        assert!(!busy(&s(0, Net::Activity(3)), &s(5_000_000, Net::Activity(3)), poll), "0.5% of a core, nothing counted");
        assert!(busy(&s(0, Net::Activity(3)), &s(20_000_000, Net::Activity(3)), poll), "2% of a core");
        assert!(busy(&s(0, Net::Activity(3)), &s(0, Net::Activity(4)), poll), "activity counted");
        assert!(busy(&s(0, Net::Packets(9)), &s(0, Net::Packets(10)), poll), "a packet, where the rules do not count");
        assert!(!busy(&s(0, Net::Packets(9)), &s(0, Net::Packets(9)), poll));
        // The rules came in (or went): not idle on that sample alone.
        assert!(busy(&s(0, Net::Packets(3)), &s(0, Net::Activity(3)), poll));
    }

    #[test]
    fn a_suspend_request_is_taken_once() {
        let d = dir();
        std::fs::write(d.path().join("request"), "suspend\n").unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::Suspend));
        assert!(!d.path().join("request").exists());
        assert_eq!(take_request_in(d.path()), None);
    }

    /// A symlink to a host file: not followed, its contents never read or
    /// told, the link removed and the file left alone.
    #[test]
    fn a_symlink_is_not_followed() {
        let d = dir();
        let secret = d.path().join("secret.env");
        std::fs::write(&secret, "TORPOR_STORE_KEY=00112233").unwrap();
        symlink(&secret, d.path().join("request")).unwrap();
        let r = take_request_in(d.path()).unwrap();
        assert_eq!(r, Request::NotAFile);
        assert!(!r.to_string().contains("TORPOR_STORE_KEY"));
        assert!(std::fs::symlink_metadata(d.path().join("request")).is_err());
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "TORPOR_STORE_KEY=00112233");
        // A symlink to /dev/zero is not read either (once: memory exhausted).
        symlink("/dev/zero", d.path().join("request")).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::NotAFile));
    }

    /// A FIFO nobody writes: once a blocking read wedged the policy loop.
    #[test]
    fn a_fifo_does_not_block() {
        let d = dir();
        nix::unistd::mkfifo(&d.path().join("request"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = d.path().to_path_buf();
        std::thread::spawn(move || tx.send(take_request_in(&path)).unwrap());
        // Liveness bound only.
        let r = rx.recv_timeout(Duration::from_secs(60)).expect("reading the request FIFO blocked");
        assert_eq!(r, Some(Request::NotAFile));
        assert!(!d.path().join("request").exists());
    }

    /// An unknown request is told by its size, never its contents, and
    /// only the first bytes of a large file are read.
    #[test]
    fn an_unknown_request_is_told_by_size_only() {
        let d = dir();
        std::fs::write(d.path().join("request"), "password=hunter2").unwrap();
        let r = take_request_in(d.path()).unwrap();
        assert_eq!(r, Request::Unknown { bytes: 16 });
        let msg = r.to_string();
        assert!(msg.contains("16 bytes") && !msg.contains("hunter2"), "{msg}");
        // "suspend" followed by more than the bound is not a request.
        std::fs::write(d.path().join("request"), format!("suspend{}", " ".repeat(1 << 20))).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::Unknown { bytes: 7 + (1 << 20) }));
        std::fs::create_dir_all(d.path().join("request/sub")).unwrap();
        assert_eq!(take_request_in(d.path()), Some(Request::NotAFile));
        assert!(!d.path().join("request").exists());
    }
}
