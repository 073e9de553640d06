//! A container's cgroup, on cgroup v1 or v2, under runc's cgroupfs or
//! systemd driver: where the shim reads OOM kills, memory and CPU use, how
//! it freezes and thaws what runc does not, and how it kills whatever is
//! left in it.
//!
//! | what | v2 (unified) | v1 (one hierarchy per controller) |
//! | --- | --- | --- |
//! | where a process is | `0::/path` in `/proc/<pid>/cgroup` | `N:memory:/path` (one line a hierarchy) |
//! | OOM kills | `memory.events` `oom_kill` (watched by inotify: [`OomWatch`]) | `memory.oom_control` `oom_kill` (watched by an eventfd) |
//! | memory | `memory.current`, `memory.max`, `memory.stat` | `memory.usage_in_bytes`, `memory.limit_in_bytes`, `memory.stat` |
//! | CPU | `cpu.stat` (`usage_usec`, throttling) | `cpuacct.usage`, `cpu.stat` |
//! | freeze | `cgroup.freeze`, `cgroup.events` `frozen` | `freezer.state` |
//! | kill | `cgroup.kill` (else each pid) | each pid of `cgroup.procs` |
//!
//! The hierarchy roots (`/sys/fs/cgroup`, `/proc`) are a [`Roots`], so
//! tests run on recorded trees (`runtime/tests/data/cgroup/`).

pub mod files;
mod oom;
pub mod path;
mod stats;

pub use oom::OomWatch;
pub use stats::{Counter, Pids, Stats};
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::error::{Error, IoContext, Result};

/// Where the kernel's cgroup hierarchies and procfs are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    /// `/sys/fs/cgroup`: the unified hierarchy (v2), or a directory of one
    /// hierarchy per controller (v1).
    pub cgroup: PathBuf,
    /// `/proc`.
    pub proc: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots::host()
    }
}

/// Which cgroup version a [`Roots`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    V1,
    V2,
}

/// A container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    /// Its directory in the unified hierarchy.
    V2(PathBuf),
    /// Its directory in each v1 hierarchy, by controller (`memory`,
    /// `cpuacct`, `freezer`, `pids`, `name=systemd`, ...). Controllers
    /// mounted together (`cpu,cpuacct`) share a directory.
    V1(BTreeMap<String, PathBuf>),
}

/// The memory a cgroup holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes charged (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub usage: u64,
    /// The limit, `None` for none (v2 `memory.max`, v1 `memory.limit_in_bytes`).
    pub limit: Option<u64>,
    /// Anonymous memory (v2 `anon`, v1 `total_rss`).
    pub anon: u64,
    /// Inactive page cache, which reclaim takes first (v2 `inactive_file`,
    /// v1 `total_inactive_file`).
    pub inactive_file: u64,
    /// Every counter of `memory.stat`, as the kernel names it.
    pub stat: BTreeMap<String, u64>,
}

impl MemoryStats {
    /// What kubelet calls the working set: usage less inactive page cache.
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }
}

/// CPU a cgroup used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Total CPU time, ns (v2 `usage_usec` × 1000, v1 `cpuacct.usage`).
    pub usage_ns: u64,
    /// CFS periods, and those in which the quota throttled the cgroup.
    pub periods: u64,
    pub throttled_periods: u64,
    /// Time throttled, ns (v2 `throttled_usec` × 1000, v1 `throttled_time`).
    pub throttled_ns: u64,
}

/// The freezer's state of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerState {
    Thawed,
    /// Asked to freeze, not all tasks stopped yet (v1 `FREEZING`; v2
    /// `cgroup.freeze` 1 while `cgroup.events` says `frozen 0`).
    Freezing,
    Frozen,
}

impl Roots {
    /// The host's: `/sys/fs/cgroup` and `/proc`.
    pub fn host() -> Roots {
        Roots { cgroup: PathBuf::from("/sys/fs/cgroup"), proc: PathBuf::from("/proc") }
    }

    /// Roots somewhere else (a recorded tree, a guest's mount).
    pub fn at(cgroup: impl Into<PathBuf>, proc: impl Into<PathBuf>) -> Roots {
        Roots { cgroup: cgroup.into(), proc: proc.into() }
    }

    /// v2 when the root is the unified hierarchy (it has
    /// `cgroup.controllers`); otherwise v1 (a hybrid host's `unified`
    /// subtree holds no controllers and is not used).
    pub fn hierarchy(&self) -> Hierarchy {
        if self.cgroup.join("cgroup.controllers").is_file() {
            Hierarchy::V2
        } else {
            Hierarchy::V1
        }
    }

    /// The v1 hierarchies, by controller: each directory below the root
    /// that is one (`cpu,cpuacct` gives `cpu` and `cpuacct`; `systemd`
    /// is `name=systemd`), symlinked aliases skipped.
    fn v1_hierarchies(&self) -> Result<BTreeMap<String, PathBuf>> {
        let root = &self.cgroup;
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(root).io_context(|| format!("list {root:?}"))? {
            let entry = entry.io_context(|| format!("list {root:?}"))?;
            let ty = entry.file_type().io_context(|| format!("stat {:?}", entry.path()))?;
            let dir = entry.path();
            if !ty.is_dir() || dir.join("cgroup.controllers").exists() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            for c in name.split(',') {
                let c = if c == "systemd" { "name=systemd".to_string() } else { c.to_string() };
                out.insert(c, dir.clone());
            }
        }
        Ok(out)
    }

    /// The cgroup live process `pid` is in (`/proc/<pid>/cgroup`).
    pub fn of_pid(&self, pid: i32) -> Result<Cgroup> {
        let file = self.proc.join(pid.to_string()).join("cgroup");
        let text = files::read(&file)?;
        let entries = parse_proc_cgroup(&text).map_err(|why| files::malformed(&file, why))?;
        match self.hierarchy() {
            Hierarchy::V2 => {
                let (_, rel) = entries
                    .iter()
                    .find(|(ctrls, _)| ctrls.is_empty())
                    .ok_or_else(|| files::malformed(&file, "no 0:: line on a cgroup v2 host"))?;
                Ok(Cgroup::V2(self.cgroup.join(rel)))
            }
            Hierarchy::V1 => {
                let hier = self.v1_hierarchies()?;
                let mut dirs = BTreeMap::new();
                for (ctrls, rel) in &entries {
                    for c in ctrls.split(',').filter(|c| !c.is_empty()) {
                        if let Some(h) = hier.get(c) {
                            dirs.insert(c.to_string(), h.join(rel));
                        }
                    }
                }
                if dirs.is_empty() {
                    return Err(Error::NotFound(format!("a mounted v1 hierarchy for any line of {file:?}")));
                }
                Ok(Cgroup::V1(dirs))
            }
        }
    }

    /// The cgroup of OCI cgroupsPath `cgroups_path` (cgroupfs `/a/b`, or
    /// systemd `slice:prefix:name`), where it exists: `NotFound` when no
    /// hierarchy has it (runc removed it, or never made it).
    pub fn of_path(&self, cgroups_path: &str) -> Result<Cgroup> {
        let rel = path::relative_dir(cgroups_path)?;
        match self.hierarchy() {
            Hierarchy::V2 => {
                let dir = self.cgroup.join(&rel);
                if !dir.join("cgroup.procs").is_file() {
                    return Err(Error::NotFound(format!("cgroup {dir:?}")));
                }
                Ok(Cgroup::V2(dir))
            }
            Hierarchy::V1 => {
                let dirs: BTreeMap<String, PathBuf> = self
                    .v1_hierarchies()?
                    .into_iter()
                    .map(|(c, h)| (c, h.join(&rel)))
                    .filter(|(_, d)| d.join("cgroup.procs").is_file())
                    .collect();
                if dirs.is_empty() {
                    return Err(Error::NotFound(format!("cgroup {rel:?} in any hierarchy under {:?}", self.cgroup)));
                }
                Ok(Cgroup::V1(dirs))
            }
        }
    }
}

/// The cgroups of a `/proc/<pid>/cgroup` file: (controller, path relative
/// to its hierarchy), one per controller of each line (`""` for the v2
/// line, `name=systemd` for a named hierarchy).
pub fn controllers_of(file: &Path) -> Result<Vec<(String, PathBuf)>> {
    let text = files::read(file)?;
    let entries = parse_proc_cgroup(&text).map_err(|why| files::malformed(file, why))?;
    Ok(entries.into_iter().flat_map(|(ctrls, rel)| ctrls.split(',').map(|c| (c.to_string(), rel.clone())).collect::<Vec<_>>()).collect())
}

/// `/proc/<pid>/cgroup`: (controllers, path relative to the hierarchy) a
/// line; `0::/x` (v2) has no controllers. A path that would leave its
/// hierarchy is refused.
fn parse_proc_cgroup(text: &str) -> std::result::Result<Vec<(String, PathBuf)>, String> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let mut parts = line.splitn(3, ':');
            let (Some(_id), Some(ctrls), Some(p)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {line:?} is not id:controllers:path"));
            };
            let p = p.strip_suffix(" (deleted)").unwrap_or(p);
            Ok((ctrls.to_string(), path::plain(Path::new(p.trim_start_matches('/')))?))
        })
        .collect()
}

impl Cgroup {
    /// Its directory for v1 controller `controller` (on v2, the one directory).
    pub fn dir(&self, controller: &str) -> Result<&Path> {
        match self {
            Cgroup::V2(d) => Ok(d),
            Cgroup::V1(dirs) => dirs
                .get(controller)
                .map(PathBuf::as_path)
                .ok_or_else(|| Error::NotFound(format!("the {controller} controller's hierarchy for cgroup {self}"))),
        }
    }

    /// The distinct directories (v1: one per hierarchy).
    pub fn dirs(&self) -> Vec<&Path> {
        match self {
            Cgroup::V2(d) => vec![d.as_path()],
            Cgroup::V1(dirs) => {
                let mut v: Vec<&Path> = dirs.values().map(PathBuf::as_path).collect();
                v.sort();
                v.dedup();
                v
            }
        }
    }

    /// How many processes the kernel's OOM killer killed in it so far.
    pub fn oom_kills(&self) -> Result<u64> {
        match self {
            Cgroup::V2(d) => files::counter(&d.join("memory.events"), "oom_kill"),
            Cgroup::V1(_) => files::counter(&self.dir("memory")?.join("memory.oom_control"), "oom_kill"),
        }
    }

    /// The memory it holds now.
    pub fn memory(&self) -> Result<MemoryStats> {
        let (usage, limit, stat_file, anon, inactive) = match self {
            Cgroup::V2(d) => (d.join("memory.current"), d.join("memory.max"), d.join("memory.stat"), "anon", "inactive_file"),
            Cgroup::V1(_) => {
                let d = self.dir("memory")?;
                (
                    d.join("memory.usage_in_bytes"),
                    d.join("memory.limit_in_bytes"),
                    d.join("memory.stat"),
                    "total_rss",
                    "total_inactive_file",
                )
            }
        };
        let stat = files::keyed(&files::read(&stat_file)?);
        let key = |k: &str| stat.get(k).copied().ok_or_else(|| files::malformed(&stat_file, format!("no {k} line")));
        Ok(MemoryStats {
            usage: files::number(&usage)?,
            limit: files::limit(&limit)?,
            anon: key(anon)?,
            inactive_file: key(inactive)?,
            stat,
        })
    }

    /// The CPU it used so far.
    pub fn cpu(&self) -> Result<CpuStats> {
        match self {
            Cgroup::V2(d) => {
                let file = d.join("cpu.stat");
                v2_cpu(&file, &files::keyed(&files::read(&file)?))
            }
            Cgroup::V1(dirs) => {
                let usage_ns = files::number(&self.dir("cpuacct")?.join("cpuacct.usage"))?;
                let throttle = match dirs.get("cpu") {
                    Some(d) => files::keyed(&files::read(&d.join("cpu.stat"))?),
                    None => BTreeMap::new(),
                };
                Ok(CpuStats {
                    usage_ns,
                    periods: throttle.get("nr_periods").copied().unwrap_or(0),
                    throttled_periods: throttle.get("nr_throttled").copied().unwrap_or(0),
                    throttled_ns: throttle.get("throttled_time").copied().unwrap_or(0),
                })
            }
        }
    }

    /// The processes in it (v1: in any of its hierarchies; one removed
    /// already holds none), sorted.
    pub fn procs(&self) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        let dirs = self.dirs();
        let several = dirs.len() > 1;
        for d in dirs {
            match files::pids(&d.join("cgroup.procs")) {
                Ok(p) => pids.extend(p),
                Err(Error::Io { source, .. }) if several && source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Whether any process is left in it or (v2) below it.
    pub fn populated(&self) -> Result<bool> {
        match self {
            Cgroup::V2(d) => Ok(files::counter(&d.join("cgroup.events"), "populated")? != 0),
            Cgroup::V1(_) => Ok(!self.procs()?.is_empty()),
        }
    }

    /// The freezer's state (v2 `cgroup.freeze` and `cgroup.events`, v1
    /// `freezer.state`).
    pub fn freezer_state(&self) -> Result<FreezerState> {
        match self {
            Cgroup::V2(d) => {
                let asked = files::number(&d.join("cgroup.freeze"))? != 0;
                let frozen = files::counter(&d.join("cgroup.events"), "frozen")? != 0;
                Ok(match (asked, frozen) {
                    (_, true) => FreezerState::Frozen,
                    (true, false) => FreezerState::Freezing,
                    (false, false) => FreezerState::Thawed,
                })
            }
            Cgroup::V1(_) => {
                let file = self.dir("freezer")?.join("freezer.state");
                match files::read(&file)?.trim() {
                    "THAWED" => Ok(FreezerState::Thawed),
                    "FREEZING" => Ok(FreezerState::Freezing),
                    "FROZEN" => Ok(FreezerState::Frozen),
                    other => Err(files::malformed(&file, format!("unknown freezer state {other:?}"))),
                }
            }
        }
    }

    /// Asks the freezer to freeze it (v2 `cgroup.freeze` 1, v1
    /// `freezer.state` FROZEN); [`Cgroup::freeze`] waits until it is.
    pub fn request_freeze(&self) -> Result<()> {
        match self {
            Cgroup::V2(d) => files::write(&d.join("cgroup.freeze"), "1"),
            Cgroup::V1(_) => files::write(&self.dir("freezer")?.join("freezer.state"), "FROZEN"),
        }
    }

    /// Thaws it (v2 `cgroup.freeze` 0, v1 `freezer.state` THAWED).
    pub fn thaw(&self) -> Result<()> {
        match self {
            Cgroup::V2(d) => files::write(&d.join("cgroup.freeze"), "0"),
            Cgroup::V1(_) => files::write(&self.dir("freezer")?.join("freezer.state"), "THAWED"),
        }
    }

    /// Freezes it and waits until every task is stopped (v2: `cgroup.events`
    /// says `frozen 1`; v1: `freezer.state` reads FROZEN), or thaws it
    /// again and fails after `deadline`.
    pub async fn freeze(&self, deadline: Duration) -> Result<()> {
        self.request_freeze()?;
        let start = Instant::now();
        loop {
            if self.freezer_state()? == FreezerState::Frozen {
                return Ok(());
            }
            if start.elapsed() >= deadline {
                let thawed = self.thaw();
                return Err(Error::FailedPrecondition(format!(
                    "cgroup {self} did not freeze within {deadline:?} (thawed again: {thawed:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One round of killing what is in it: v2 `cgroup.kill` (the whole
    /// subtree, atomically), else SIGKILL to each pid of `cgroup.procs`;
    /// then a thaw, so that a frozen v1 task dies (a frozen v2 task dies
    /// of SIGKILL as it is). Returns the pids it signalled (v2 with
    /// `cgroup.kill`: those listed before).
    pub fn kill_once(&self) -> Result<Vec<i32>> {
        let pids = self.procs()?;
        match self {
            Cgroup::V2(d) if d.join("cgroup.kill").exists() => files::write(&d.join("cgroup.kill"), "1")?,
            _ => {
                for p in &pids {
                    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::Signal::SIGKILL) {
                        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                        Err(source) => {
                            return Err(Error::Sys { context: format!("kill pid {p} of cgroup {self}"), source });
                        }
                    }
                }
            }
        }
        let has_freezer = match self {
            Cgroup::V2(_) => true,
            Cgroup::V1(dirs) => dirs.contains_key("freezer"),
        };
        if has_freezer {
            if let Err(e) = self.thaw() {
                debug!(cgroup = %self, "kill: thaw: {e}");
            }
        }
        Ok(pids)
    }
}

/// v2's CPU use from the counters of its `cpu.stat` (`file`, for errors).
fn v2_cpu(file: &Path, s: &BTreeMap<String, u64>) -> Result<CpuStats> {
    let usage = s.get("usage_usec").ok_or_else(|| files::malformed(file, "no usage_usec line"))?;
    // Without the cpu controller enabled, only the usage lines exist.
    Ok(CpuStats {
        usage_ns: usage.saturating_mul(1000),
        periods: s.get("nr_periods").copied().unwrap_or(0),
        throttled_periods: s.get("nr_throttled").copied().unwrap_or(0),
        throttled_ns: s.get("throttled_usec").copied().unwrap_or(0).saturating_mul(1000),
    })
}

impl std::fmt::Display for Cgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cgroup::V2(d) => write!(f, "{}", d.display()),
            Cgroup::V1(dirs) => match dirs.get("memory").or_else(|| dirs.values().next()) {
                Some(d) => write!(f, "{} (v1)", d.display()),
                None => f.write_str("(no v1 hierarchy)"),
            },
        }
    }
}

/// The cgroup of live process `pid` on this host; `None` (logged) if it
/// cannot be found.
pub fn cgroup_of(pid: i32) -> Option<Cgroup> {
    Roots::host().of_pid(pid).map_err(|e| warn!(pid, "the process's cgroup: {e}")).ok()
}

/// How many processes the OOM killer killed in `cg`; 0 (logged) when that
/// cannot be read (the cgroup is gone).
pub fn oom_kills(cg: &Cgroup) -> u64 {
    cg.oom_kills().map_err(|e| debug!(cgroup = %cg, "oom kills: {e}")).unwrap_or(0)
}

/// CPU time (ns) used so far by the cgroup of process `pid`: the idle
/// policy's input. `None` (logged) when it cannot be read.
pub fn cpu_ns(pid: i32) -> Option<u64> {
    cpu_ns_in(&Roots::host(), pid)
}

fn cpu_ns_in(roots: &Roots, pid: i32) -> Option<u64> {
    roots.of_pid(pid).and_then(|cg| cg.cpu()).map(|s| s.usage_ns).map_err(|e| debug!(pid, "cpu use of the process's cgroup: {e}")).ok()
}

/// SIGKILLs every process in the cgroup of OCI cgroupsPath `path` (either
/// driver's form), thawing a frozen one so that the kill lands, until it
/// is empty or 2 s passed (containerd gives a cleanup 5 s).
pub async fn kill_cgroup(path: &str) {
    kill_cgroup_in(&Roots::host(), path).await
}

async fn kill_cgroup_in(roots: &Roots, path: &str) {
    let cg = match roots.of_path(path) {
        Ok(cg) => cg,
        Err(Error::NotFound(what)) => {
            debug!(cgroup = path, "cleanup: nothing to kill: no {what}");
            return;
        }
        Err(e) => {
            warn!(cgroup = path, "cleanup: cannot kill what is left in the cgroup: {e}");
            return;
        }
    };
    for round in 0..100 {
        match cg.populated() {
            Ok(false) => return,
            Ok(true) => {}
            // Removed under us (runc delete finished): nothing is left.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!(cgroup = %cg, "cleanup: read the cgroup: {e}");
                return;
            }
        }
        match cg.kill_once() {
            Ok(pids) if round == 0 => info!(cgroup = %cg, pids = ?pids, "cleanup: killing what is left in the cgroup"),
            Ok(_) => {}
            Err(e) => warn!(cgroup = %cg, "cleanup: kill: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    warn!(cgroup = %cg, "cleanup: processes are still left in the cgroup");
}
