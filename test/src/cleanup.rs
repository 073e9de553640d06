//! [`Cleanup`]: the guard of the tests for whatever a test changed that must
//! be undone when it ends, also when it panics (a stopped S3 server started
//! again, a crash point disarmed, the snapshots of an actor removed, ...).
//! Things a test owns have guards of their own ([`crate::Pod`],
//! [`crate::CtrContainer`], [`crate::TempDir`], [`crate::DeadNode`]).

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::Node;

type Undo = Box<dyn FnOnce() + Send + Sync>;

/// Runs its undo when dropped, best effort: it may run while the test
/// unwinds, so a panic in it is caught and printed, never propagated.
#[must_use = "a Cleanup undoes at once if it is not kept"]
pub struct Cleanup {
    what: String,
    undo: Option<Undo>,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cleanup({}{})", self.what, if self.undo.is_some() { "" } else { ", disarmed" })
    }
}

impl Cleanup {
    /// `undo` runs on drop; `what` names it in a failure message.
    pub fn new(what: impl Into<String>, undo: impl FnOnce() + Send + Sync + 'static) -> Cleanup {
        Cleanup { what: what.into(), undo: Some(Box::new(undo)) }
    }

    /// Runs the undo now, checked: a panic in it fails the test.
    #[track_caller]
    pub fn now(mut self) {
        if let Some(undo) = self.undo.take() {
            undo()
        }
    }

    /// Drops the undo without running it (the test has undone it itself).
    pub fn disarm(mut self) {
        self.undo = None;
    }

    /// Removes every snapshot of `actor` from node A's store on drop (tests
    /// that leave snapshots by policy, e.g. a suspended actor removed).
    pub fn snapshots(actor: &str) -> Cleanup {
        let actor = actor.to_string();
        Cleanup::new(format!("the snapshots of {actor}"), move || Node::a().remove_snapshots(&actor))
    }

    /// Removes every snapshot of `actor` from both nodes' stores (and so from
    /// the object tier) on drop.
    pub fn snapshots_everywhere(actor: &str) -> Cleanup {
        let actor = actor.to_string();
        Cleanup::new(format!("the snapshots of {actor} on both nodes"), move || {
            for node in [Node::b(), Node::a()] {
                let _ = catch_unwind(AssertUnwindSafe(|| node.remove_snapshots(&actor)));
            }
        })
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            if catch_unwind(AssertUnwindSafe(undo)).is_err() {
                eprintln!("cleanup of {} failed (see the panic above)", self.what);
            }
        }
    }
}

/// Arms failpoint `point` of shim `shim` (runtime/src/failpoint.rs: the
/// rig's shim is a `failpoints` build reading `$TORPOR_FAILPOINTS_DIR`);
/// disarmed when the guard drops.
#[track_caller]
pub fn arm_failpoint(shim: &str, point: &str) -> Cleanup {
    let dir = std::env::var("TORPOR_FAILPOINTS_DIR")
        .ok()
        .filter(|s| !s.is_empty())
        .expect("TORPOR_FAILPOINTS_DIR is not set: run the tests through test/rig/run-tests.sh");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
    let p = std::path::Path::new(&dir).join(shim);
    std::fs::write(&p, point).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    Cleanup::new(format!("failpoint {point} of {shim}"), move || {
        let _ = std::fs::remove_file(&p);
    })
}
