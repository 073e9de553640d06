//! Where a lifecycle operation's time goes: its phases in order, and the
//! CPU time it cost (kept in the record: `torporctl --json status`, the
//! bench's phase tables).

use std::time::Instant;

use crate::actor::record::Phase;

/// The phases of one operation, timed from [`Timing::start`].
pub(crate) struct Timing {
    last: Instant,
    phases: Vec<Phase>,
    cpu_start_us: Option<u64>,
}

impl Timing {
    pub(crate) fn start() -> Timing {
        Timing { last: Instant::now(), phases: Vec::new(), cpu_start_us: cpu_us() }
    }

    /// The time since the previous mark was phase `name` (added up when a
    /// phase repeats, once per container).
    pub(crate) fn mark(&mut self, name: &str) {
        let now = Instant::now();
        let us = u64::try_from(now.duration_since(self.last).as_micros()).unwrap_or(u64::MAX);
        self.last = now;
        match self.phases.iter_mut().find(|p| p.name == name) {
            Some(p) => p.us = p.us.saturating_add(us),
            None => self.phases.push(Phase { name: name.to_string(), us }),
        }
    }

    pub(crate) fn phases(&self) -> Vec<Phase> {
        self.phases.clone()
    }

    /// CPU time (user + system, µs) since the start: the shim's own, and
    /// that of the processes it waited for meanwhile (runc, and the CRIU
    /// runc waited for). Not the restored processes; a lazy-pages daemon is
    /// counted when it exits.
    pub(crate) fn cpu_us(&self) -> Option<u64> {
        Some(cpu_us()?.saturating_sub(self.cpu_start_us?))
    }
}

fn cpu_us() -> Option<u64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let mut total = 0u64;
    for who in [UsageWho::RUSAGE_SELF, UsageWho::RUSAGE_CHILDREN] {
        let u = getrusage(who).ok()?;
        for t in [u.user_time(), u.system_time()] {
            let us = u64::try_from(t.tv_sec()).ok()?.checked_mul(1_000_000)?.checked_add(u64::try_from(t.tv_usec()).ok()?)?;
            total = total.checked_add(us)?;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_keep_their_order_and_add_up_when_repeated() {
        let mut t = Timing::start();
        t.mark("checkout");
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.mark("restore");
        t.mark("restore");
        t.mark("handover");
        let names: Vec<_> = t.phases().iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, ["checkout", "restore", "handover"]);
        assert!(t.phases()[1].us >= 2000, "{:?}", t.phases());
        assert!(t.cpu_us().is_some());
    }
}
