//! Crash points for the crash-safety tests: the shim kills itself with
//! SIGKILL at a named point of a suspend or a resume.
//!
//! Test-only: the points do something only in a build with the
//! `failpoints` feature (`test/rig/run-tests.sh` builds the shim that way);
//! in any other build [`hit`] is an empty inline function.
//!
//! With the feature, a point looks for the file
//! `$TORPOR_FAILPOINTS_DIR/<shim id>` (the rig exports the variable to its
//! containerd, which passes its environment on to the shims). If the file
//! holds the point's name, the shim kills itself right there; a `*-during-*`
//! point instead arms a watcher and returns: the shim kills itself as soon as
//! a CRIU process runs below it (the dump or restore under way). The file is
//! read at every point, so a test arms a point while the shim runs.

/// SUSPENDING persisted, nothing frozen yet.
pub const SUSPEND_AFTER_PERSIST: &str = "suspend-after-persist";
/// Every app container frozen, no dump started.
pub const SUSPEND_AFTER_FREEZE: &str = "suspend-after-freeze";
/// While CRIU dumps a container.
pub const SUSPEND_DURING_DUMP: &str = "suspend-during-dump";
/// While CRIU dumps a container, CRIU is stopped (SIGSTOP) until the point
/// is disarmed: a dump that takes as long as the test needs, to show what
/// answers meanwhile. Not a crash point.
pub const SUSPEND_STALL_DURING_DUMP: &str = "suspend-stall-during-dump";
/// Every container dumped (and marked so), SUSPENDED not persisted yet.
pub const SUSPEND_AFTER_DUMP: &str = "suspend-after-dump";
/// RESUMING persisted, no restore started.
pub const RESUME_AFTER_PERSIST: &str = "resume-after-persist";
/// While CRIU restores a container.
pub const RESUME_DURING_RESTORE: &str = "resume-during-restore";
/// Every container restored and running, RUNNING not persisted yet.
pub const RESUME_AFTER_RESTORE: &str = "resume-after-restore";

/// The restore of one named container fails (armed as
/// `restore-fails:<container name>`): a restore that fails part-way through
/// a pod, before CRIU runs. Not a crash point: see [`fails`].
pub const RESTORE_FAILS: &str = "restore-fails";

/// The save of the actor record for one state fails as on a full disk
/// (armed as `record-save-fails:<STATE>`, e.g. `SUSPENDED`). Not a crash
/// point: see [`fails`].
pub const RECORD_SAVE_FAILS: &str = "record-save-fails";

/// The suspend's background commit waits while this point is armed: a
/// dump that stays a staging (not a snapshot) as long as the test needs.
/// Not a crash point: see [`armed`].
pub const COMMIT_HELD: &str = "commit-held";

/// Not a crash point: while armed, the freeze tier sees memory pressure
/// on the node (its MemAvailable threshold is unbounded), so a frozen
/// actor is checkpointed early ([`crate::trigger::policy`]).
pub const FREEZE_PRESSURE: &str = "freeze-pressure";

/// The environment variable naming the directory of armed points.
pub const DIR_ENV: &str = "TORPOR_FAILPOINTS_DIR";

/// Passes the crash point `point` of the shim `shim` (see the module doc).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_shim: &str, _point: &str) {}

/// Passes the crash point `point` of the shim `shim` (see the module doc).
#[cfg(feature = "failpoints")]
pub fn hit(shim: &str, point: &str) {
    let Some(dir) = std::env::var_os(DIR_ENV) else { return };
    let Ok(armed) = std::fs::read_to_string(std::path::Path::new(&dir).join(shim)) else { return };
    let stall = point == SUSPEND_DURING_DUMP && armed.trim() == SUSPEND_STALL_DURING_DUMP;
    if stall {
        stall_criu(std::path::Path::new(&dir).join(shim));
        return;
    }
    if armed.trim() != point {
        return;
    }
    if point.contains("-during-") {
        tracing::warn!(point, shim, "failpoint armed: the shim is killed once CRIU runs");
        let shim = shim.to_string();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
            while std::time::Instant::now() < deadline {
                if criu_below(std::process::id()) {
                    tracing::warn!(point = "during", shim = shim.as_str(), "failpoint: CRIU runs, killing the shim");
                    kill_self();
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        return;
    }
    tracing::warn!(point, shim, "failpoint: killing the shim");
    kill_self();
}

/// Whether the failure point `point` is armed for `name` in shim `shim`
/// (the armed file holds `<point>:<name>`): the caller then fails the step
/// as if it had failed for real.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fails(_shim: &str, _point: &str, _name: &str) -> bool {
    false
}

/// Whether the failure point `point` is armed for `name` in shim `shim`
/// (the armed file holds `<point>:<name>`): the caller then fails the step
/// as if it had failed for real.
#[cfg(feature = "failpoints")]
pub fn fails(shim: &str, point: &str, name: &str) -> bool {
    let Some(dir) = std::env::var_os(DIR_ENV) else { return false };
    let Ok(armed) = std::fs::read_to_string(std::path::Path::new(&dir).join(shim)) else { return false };
    let hit = armed.trim().strip_prefix(point).and_then(|r| r.strip_prefix(':')) == Some(name);
    if hit {
        tracing::warn!(point, shim, name, "failpoint: this step fails");
    }
    hit
}

/// Whether the point `point` is armed in shim `shim` (the armed file holds
/// exactly its name).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn armed(_shim: &str, _point: &str) -> bool {
    false
}

/// Whether the point `point` is armed in shim `shim` (the armed file holds
/// exactly its name).
#[cfg(feature = "failpoints")]
pub fn armed(shim: &str, point: &str) -> bool {
    let Some(dir) = std::env::var_os(DIR_ENV) else { return false };
    std::fs::read_to_string(std::path::Path::new(&dir).join(shim)).is_ok_and(|a| a.trim() == point)
}

/// SIGSTOPs every CRIU process below the shim as soon as one runs, until
/// `armed` no longer names [`SUSPEND_STALL_DURING_DUMP`]; then SIGCONTs them.
#[cfg(feature = "failpoints")]
fn stall_criu(armed: std::path::PathBuf) {
    use nix::sys::signal::{kill, Signal};
    tracing::warn!(point = SUSPEND_STALL_DURING_DUMP, "failpoint armed: CRIU is stopped once it runs, until disarmed");
    std::thread::spawn(move || {
        let still = || std::fs::read_to_string(&armed).is_ok_and(|a| a.trim() == SUSPEND_STALL_DURING_DUMP);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        let mut stopped: Vec<u32> = Vec::new();
        while still() && std::time::Instant::now() < deadline {
            for pid in criu_pids_below(std::process::id()) {
                if !stopped.contains(&pid) && kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP).is_ok() {
                    tracing::warn!(pid, "failpoint: CRIU stopped");
                    stopped.push(pid);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for pid in stopped {
            let _ = kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
        tracing::warn!(point = SUSPEND_STALL_DURING_DUMP, "failpoint disarmed: CRIU continues");
    });
}

#[cfg(feature = "failpoints")]
fn kill_self() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
}

/// Whether a process named `criu` descends from `pid`.
#[cfg(feature = "failpoints")]
fn criu_below(pid: u32) -> bool {
    !criu_pids_below(pid).is_empty()
}

/// The processes named `criu` that descend from `pid` (through the
/// `/proc/<pid>/task/<tid>/children` lists).
#[cfg(feature = "failpoints")]
fn criu_pids_below(pid: u32) -> Vec<u32> {
    let mut todo = vec![pid];
    let mut found = Vec::new();
    let mut seen = 0;
    while let Some(p) = todo.pop() {
        seen += 1;
        if seen > 10_000 {
            break;
        }
        if p != pid && std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "criu") {
            found.push(p);
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for t in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(t.path().join("children")) {
                todo.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
        }
    }
    found
}
