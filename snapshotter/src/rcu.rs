//! The kernel's RCU grace periods, expedited while the daemon serves.
//!
//! A resume waits for RCU grace periods it cannot avoid: runc moving CRIU
//! into the container's cgroup v1 hierarchies (`cgroup.procs`, a write of
//! the cgroup threadgroup rwsem), and CRIU setting the hardware breakpoint
//! that stops each restored task (`ptrace` → `perf_event_alloc`). Both call
//! `synchronize_rcu()`; a normal grace period on a mostly idle node waits
//! for the tick on every CPU, and the CPUs sit idle meanwhile. On the bench
//! machine that was about 23 ms of a 60 ms `runc restore` (sched_switch
//! stacks of 3 resumes), and a 256 MiB resume's p50 went 84 → 57 ms with
//! `/sys/kernel/rcu_expedited` set (probe, 8 resumes each).
//!
//! `rcu_expedited = true` (docs/CONFIG.md, the default) sets that knob to 1
//! while the daemon runs: every grace period is then expedited (IPIs to the
//! busy CPUs instead of waiting for their ticks), for the whole node. The
//! value found is restored at the daemon's stop. A marker file in `/run`
//! remembers it in between, so that a daemon killed without its stop, and
//! started again, still restores the node's own value at its next stop
//! (and `test/rig/down.sh` restores it when no daemon is left).
//!
//! A node that already expedites them is left alone; a knob that cannot be
//! read or written (no such kernel, a read-only `/sys`) is a warning.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

/// The kernel's knob.
pub const KNOB: &str = "/sys/kernel/rcu_expedited";
/// The node's own value, while a daemon has changed it.
pub const MARKER: &str = "/run/torpor-snapshotter.rcu_expedited";

/// The knob, set by this daemon; the node's value is put back when dropped.
#[derive(Debug)]
pub struct Expedited {
    knob: PathBuf,
    marker: PathBuf,
    /// The node's own value, restored at drop.
    was: u8,
}

impl Drop for Expedited {
    fn drop(&mut self) {
        match write_value(&self.knob, self.was) {
            Ok(()) => info!(knob = %self.knob.display(), value = self.was, "RCU grace periods: the node's own setting is back"),
            Err(e) => {
                warn!(knob = %self.knob.display(), "RCU grace periods: the node's own setting ({}) could not be put back: {e}", self.was)
            }
        }
        if let Err(e) = std::fs::remove_file(&self.marker) {
            if e.kind() != ErrorKind::NotFound {
                warn!(marker = %self.marker.display(), "remove: {e}");
            }
        }
    }
}

/// Expedites the node's RCU grace periods (the knob and marker of this
/// module), logging what it did. `None`: nothing to put back at the stop.
pub fn expedite() -> Option<Expedited> {
    match expedite_at(Path::new(KNOB), Path::new(MARKER)) {
        Ok(Some(e)) => {
            info!(
                knob = KNOB,
                was = e.was,
                "RCU grace periods expedited for the resumes (rcu_expedited = true); the node's own setting comes back at the stop"
            );
            Some(e)
        }
        Ok(None) => {
            info!(knob = KNOB, "RCU grace periods: the node already expedites them; left alone");
            None
        }
        Err(e) => {
            warn!(knob = KNOB, "RCU grace periods could not be expedited (resumes wait for normal ones): {e}");
            None
        }
    }
}

fn expedite_at(knob: &Path, marker: &Path) -> Result<Option<Expedited>, String> {
    let now = read_value(knob)?;
    // A marker: a daemon changed the knob and did not put it back (it was
    // killed, or it still runs beside this one); its value is the node's.
    let was = match std::fs::read_to_string(marker) {
        Ok(s) => Some(parse_value(&s).map_err(|e| format!("{}: {e}", marker.display()))?),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(format!("read {}: {e}", marker.display())),
    };
    let was = match (was, now) {
        (Some(was), _) => was,
        (None, 1) => return Ok(None),
        (None, now) => {
            // Whole (temp file, rename) before the knob changes.
            torpor_store::write_atomic(marker, format!("{now}\n").as_bytes()).map_err(|e| e.to_string())?;
            now
        }
    };
    if now != 1 {
        write_value(knob, 1).map_err(|e| format!("write 1 to {}: {e}", knob.display()))?;
    }
    Ok(Some(Expedited { knob: knob.to_path_buf(), marker: marker.to_path_buf(), was }))
}

fn read_value(knob: &Path) -> Result<u8, String> {
    let s = std::fs::read_to_string(knob).map_err(|e| format!("read {}: {e}", knob.display()))?;
    parse_value(&s).map_err(|e| format!("{}: {e}", knob.display()))
}

fn parse_value(s: &str) -> Result<u8, String> {
    match s.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        other => Err(format!("{other:?} is neither 0 nor 1")),
    }
}

fn write_value(knob: &Path, v: u8) -> std::io::Result<()> {
    std::fs::write(knob, format!("{v}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(knob: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let (k, m) = (d.path().join("rcu_expedited"), d.path().join("marker"));
        std::fs::write(&k, knob).unwrap();
        (d, k, m)
    }

    fn knob(k: &Path) -> String {
        std::fs::read_to_string(k).unwrap().trim().to_string()
    }

    #[test]
    fn the_nodes_value_is_put_back_at_the_stop() {
        let (_d, k, m) = files("0\n");
        let e = expedite_at(&k, &m).unwrap().expect("changed");
        assert_eq!(knob(&k), "1");
        assert_eq!(std::fs::read_to_string(&m).unwrap().trim(), "0", "the marker holds the node's value");
        drop(e);
        assert_eq!(knob(&k), "0");
        assert!(!m.exists(), "the marker goes with the stop");
    }

    #[test]
    fn a_node_that_already_expedites_is_left_alone() {
        let (_d, k, m) = files("1\n");
        assert!(expedite_at(&k, &m).unwrap().is_none());
        assert_eq!(knob(&k), "1");
        assert!(!m.exists());
    }

    #[test]
    fn after_a_killed_daemon_the_next_one_puts_the_nodes_value_back() {
        let (_d, k, m) = files("0\n");
        // killed: its stop never ran
        std::mem::forget(expedite_at(&k, &m).unwrap().expect("changed"));
        assert_eq!(knob(&k), "1");
        let e = expedite_at(&k, &m).unwrap().expect("the marker says the node's value is 0");
        drop(e);
        assert_eq!(knob(&k), "0");
        assert!(!m.exists());
    }

    #[test]
    fn bad_values_are_named_and_nothing_changes() {
        let (_d, k, m) = files("2\n");
        let e = expedite_at(&k, &m).unwrap_err();
        assert!(e.contains("\"2\" is neither 0 nor 1"), "{e}");
        assert!(!m.exists());
        let (_d, k, m) = files("0\n");
        std::fs::write(&m, "yes").unwrap();
        let e = expedite_at(&k, &m).unwrap_err();
        assert!(e.contains("marker") && e.contains("\"yes\""), "{e}");
        assert_eq!(knob(&k), "0");
        let e = expedite_at(&k.with_file_name("absent"), &m).unwrap_err();
        assert!(e.contains("absent"), "{e}");
    }
}
