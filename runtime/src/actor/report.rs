//! Lifecycle reports to the node daemon's metrics (the store API's
//! `ReportLifecycle`; docs/METRICS.md): after each suspend, resume,
//! restore and freeze, the operation's outcome, the class of its failure,
//! how long each of its phases took, and the actor's state.
//!
//! Never on the lifecycle's path: a report is sent from a task of its own
//! with a short deadline, at most [`MAX_IN_FLIGHT`] at once; one that
//! cannot be sent is logged at debug and counted, and the count goes with
//! the next report that is delivered. Nothing here can block, slow or fail
//! an operation.
//!
//! Phases: [`operation`] runs an operation with a timeline (task-local:
//! only code of that operation's task adds to it); [`phase`] marks the end
//! of one phase there (the time since the previous mark, or since the
//! operation began). Outside an operation it does nothing.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use torpor_api::store as api;
use tracing::debug;

use crate::actor::record::{Lifecycle, Record};
use crate::actor::snapshots::Snapshots;
use crate::error::{Error, Result, StoreErrorKind};

/// A report is given this long to be delivered.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Reports in flight at once; more are dropped (and counted).
pub const MAX_IN_FLIGHT: usize = 16;

static SEQ: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// A lifecycle operation, as the daemon's metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Suspend,
    Resume,
    /// A kept snapshot restored into a new pod.
    Restore,
    Freeze,
    /// A freeze by the lease fence.
    FenceFreeze,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Suspend => "suspend",
            Op::Resume => "resume",
            Op::Restore => "restore",
            Op::Freeze => "freeze",
            Op::FenceFreeze => "fence_freeze",
        }
    }

    /// The state the actor is in while the operation runs, when it starts
    /// from `from` (reported when it starts).
    fn under_way(self, from: Lifecycle) -> Option<&'static str> {
        match (self, from) {
            (Op::Suspend, Lifecycle::Running | Lifecycle::Frozen) => Some("suspending"),
            (Op::Resume, Lifecycle::Suspended) => Some("resuming"),
            _ => None,
        }
    }
}

/// What started a suspend or a resume: the `trigger` label of the daemon's
/// `torpor_suspend_duration_seconds` and `torpor_resume_duration_seconds`
/// (a fixed set, docs/METRICS.md; never an actor or a pod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `torporctl`, the kubectl plugin, the agent: the shim's control API.
    Api,
    /// A real inbound connection to a held port or a frozen listener.
    Connection,
    /// An exec into the suspended or frozen actor (`kubectl exec`, `crictl exec`).
    Exec,
    /// The lease fence: its lease confirmed again, a fenced actor is thawed.
    Fence,
    /// The idle policy (`torpor.dev/idle-after`).
    Idle,
    /// The actor's own request (`/run/torpor/request`).
    Request,
    /// The stop of the actor's pod (`torpor.dev/on-stop: suspend`; a thaw of
    /// the freeze tier for a stop).
    Stop,
    /// The end of the freeze tier's window (`torpor.dev/freeze-first`).
    FreezeWindow,
    /// The node's memory pressure while in the freeze tier.
    Pressure,
}

impl Trigger {
    /// Every trigger, as the daemon takes them.
    pub const ALL: [Trigger; 9] = [
        Trigger::Api,
        Trigger::Connection,
        Trigger::Exec,
        Trigger::Fence,
        Trigger::Idle,
        Trigger::Request,
        Trigger::Stop,
        Trigger::FreezeWindow,
        Trigger::Pressure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Trigger::Api => "api",
            Trigger::Connection => "connection",
            Trigger::Exec => "exec",
            Trigger::Fence => "fence",
            Trigger::Idle => "idle",
            Trigger::Request => "request",
            Trigger::Stop => "stop",
            Trigger::FreezeWindow => "freeze_window",
            Trigger::Pressure => "pressure",
        }
    }
}

/// The daemon's name of a state.
pub fn state_name(s: Lifecycle) -> &'static str {
    match s {
        Lifecycle::Running => "running",
        Lifecycle::Frozen => "frozen",
        Lifecycle::Suspending => "suspending",
        Lifecycle::Suspended => "suspended",
        Lifecycle::Resuming => "resuming",
    }
}

/// The class of a failure (the `reason` label; a fixed set, see docs/METRICS.md).
pub fn reason(e: &Error) -> &'static str {
    match e {
        Error::Store { kind, .. } => match kind {
            StoreErrorKind::Unavailable => "store_unavailable",
            StoreErrorKind::NotFound => "store_not_found",
            StoreErrorKind::Corrupt => "store_corrupt",
            StoreErrorKind::LeaseHeld | StoreErrorKind::LeaseLost => "lease",
            StoreErrorKind::InvalidArgument
            | StoreErrorKind::FailedPrecondition
            | StoreErrorKind::Unimplemented
            | StoreErrorKind::Other => "store_refused",
        },
        Error::Runc { .. } => "runc",
        Error::Io { .. } | Error::Sys { .. } => "io",
        Error::Corrupt(_) => "corrupt",
        Error::WrongState(_) => "wrong_state",
        Error::FailedPrecondition(_) => "precondition",
        Error::InvalidAnnotation { .. } | Error::InvalidArgument(_) => "invalid",
        Error::NotFound(_) => "not_found",
        Error::AlreadyExists(_) | Error::Json { .. } => "other",
    }
}

struct Timeline {
    last: Instant,
    phases: Vec<(&'static str, f64)>,
}

tokio::task_local! {
    static TIMELINE: RefCell<Timeline>;
}

/// Marks the end of phase `name` of the operation under way in this task.
pub fn phase(name: &'static str) {
    let _ = TIMELINE.try_with(|t| {
        let mut t = t.borrow_mut();
        let now = Instant::now();
        let secs = now.duration_since(t.last).as_secs_f64();
        t.phases.push((name, secs));
        t.last = now;
    });
}

/// Runs `op` (whose phases call [`phase`]) and reports it: its state when
/// it starts (SUSPENDING, RESUMING), then its outcome, phases, total and
/// the state it left (`record` reads the actor's record). An operation
/// refused because the actor is not in a state it starts from (nothing
/// was done) reports the state only.
pub async fn operation<T>(
    store: &Arc<dyn Snapshots>,
    op: Op,
    record: impl Fn() -> Option<Record>,
    run: impl Future<Output = Result<T>>,
) -> Result<T> {
    reported(store, op, None, record, run).await
}

/// [`operation`] of a suspend or a resume, started by `trigger` (told to
/// the daemon with the outcome).
pub async fn triggered<T>(
    store: &Arc<dyn Snapshots>,
    op: Op,
    trigger: Trigger,
    record: impl Fn() -> Option<Record>,
    run: impl Future<Output = Result<T>>,
) -> Result<T> {
    reported(store, op, Some(trigger), record, run).await
}

async fn reported<T>(
    store: &Arc<dyn Snapshots>,
    op: Op,
    trigger: Option<Trigger>,
    record: impl Fn() -> Option<Record>,
    run: impl Future<Output = Result<T>>,
) -> Result<T> {
    let before = record();
    if let Some((rec, s)) = before.as_ref().and_then(|r| Some((r, op.under_way(r.state)?))) {
        send(store, report(&rec.actor, s));
    }
    let started = Instant::now();
    let timeline = RefCell::new(Timeline { last: started, phases: Vec::new() });
    let (result, mut phases) = TIMELINE
        .scope(timeline, async {
            let r = run.await;
            (r, TIMELINE.with(|t| std::mem::take(&mut t.borrow_mut().phases)))
        })
        .await;
    let after = record();
    let Some(rec) = after.as_ref().or(before.as_ref()) else { return result };
    let mut r = report(&rec.actor, after.as_ref().map_or("", |a| state_name(a.state)));
    r.trigger = trigger.map_or("", Trigger::name).into();
    match &result {
        Err(Error::WrongState(_)) => {}
        Err(e) => {
            r.op = op.name().into();
            r.outcome = "failed".into();
            r.reason = reason(e).into();
        }
        Ok(_) => {
            r.op = op.name().into();
            r.outcome = "ok".into();
            phases.push(("total", started.elapsed().as_secs_f64()));
            r.phases = phases.into_iter().map(|(n, s)| lifecycle_phase(n, s)).collect();
        }
    }
    send(store, r);
    result
}

/// The actor's state changed outside an operation (its first container
/// was created: RUNNING).
pub fn state(store: &Arc<dyn Snapshots>, rec: &Record) {
    send(store, report(&rec.actor, state_name(rec.state)));
}

/// How often [`heartbeat`] tells the actor's state again.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// The actor's state again, at most every [`HEARTBEAT`] (called by the
/// lease fence's periodic pass): a daemon restarted since the last
/// operation knows it again within that time.
pub fn heartbeat(store: &Arc<dyn Snapshots>, rec: &Record) {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    {
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < HEARTBEAT) {
            return;
        }
        *last = Some(Instant::now());
    }
    state(store, rec);
}

/// A phase that ran in a task of its own (a suspend's background commit).
pub fn background_phase(store: &Arc<dyn Snapshots>, actor: &str, op: Op, name: &'static str, took: Duration) {
    let mut r = report(actor, "");
    r.op = match op {
        Op::Suspend => "commit".into(),
        other => other.name().into(),
    };
    r.outcome = "ok".into();
    r.phases = vec![lifecycle_phase(name, took.as_secs_f64())];
    send(store, r);
}

fn lifecycle_phase(name: &str, seconds: f64) -> api::LifecyclePhase {
    let mut p = api::LifecyclePhase::new();
    p.name = name.into();
    p.seconds = seconds;
    p
}

fn report(actor: &str, state: &str) -> api::LifecycleReport {
    let mut r = api::LifecycleReport::new();
    r.actor = actor.into();
    r.owner = format!("shim pid {}", std::process::id());
    r.seq = SEQ.fetch_add(1, Ordering::Relaxed) + 1;
    r.state = state.into();
    r
}

/// One report in flight (counted in [`IN_FLIGHT`] until dropped).
struct InFlight;

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends `r` from a task of its own (fire-and-forget, see the module doc).
fn send(store: &Arc<dyn Snapshots>, mut r: api::LifecycleReport) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        let n = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
        debug!(dropped = n, "lifecycle report dropped: too many in flight");
        return;
    }
    let store = store.clone();
    // Given back when the task ends, and when it never runs to its end (its
    // runtime shut down first: the tests' runtimes, one per test).
    let in_flight = InFlight;
    rt.spawn(async move {
        r.dropped = DROPPED.swap(0, Ordering::Relaxed);
        let sent = tokio::time::timeout(DEADLINE, store.report_lifecycle(&r)).await;
        drop(in_flight);
        let failed = match sent {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {DEADLINE:?}")),
        };
        if let Some(e) = failed {
            // Its own count goes back, with this one.
            let n = DROPPED.fetch_add(r.dropped + 1, Ordering::Relaxed) + r.dropped + 1;
            debug!(op = r.op.as_str(), dropped = n, "lifecycle report not delivered: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn phases_are_timed_within_their_operation_only() {
        phase("outside"); // no operation: nothing, no panic
        let phases = TIMELINE
            .scope(RefCell::new(Timeline { last: Instant::now(), phases: Vec::new() }), async {
                phase("freeze");
                tokio::time::sleep(Duration::from_millis(20)).await;
                phase("dump");
                // Another task's marks are not this operation's.
                tokio::spawn(async { phase("elsewhere") }).await.unwrap();
                TIMELINE.with(|t| std::mem::take(&mut t.borrow_mut().phases))
            })
            .await;
        let names: Vec<&str> = phases.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["freeze", "dump"]);
        assert!(phases[1].1 >= 0.02, "{phases:?}");
    }

    #[test]
    fn reasons_and_states_are_the_daemons_names() {
        assert_eq!(reason(&Error::store(StoreErrorKind::Unavailable, "x")), "store_unavailable");
        assert_eq!(reason(&Error::store(StoreErrorKind::LeaseLost, "x")), "lease");
        assert_eq!(reason(&Error::Runc { command: "checkpoint".into(), message: "x".into() }), "runc");
        assert_eq!(reason(&Error::WrongState("x".into())), "wrong_state");
        assert_eq!(state_name(Lifecycle::Suspended), "suspended");
        assert_eq!(Op::Suspend.under_way(Lifecycle::Frozen), Some("suspending"));
        assert_eq!(Op::Resume.under_way(Lifecycle::Frozen), None, "a thaw is too short to report");
    }

    #[tokio::test]
    async fn an_unreachable_daemon_neither_blocks_nor_fails_the_operation() {
        let store: Arc<dyn Snapshots> =
            Arc::new(crate::actor::store_client::SnapshotStore::at("/nonexistent/torpor-test/store.sock".into()));
        let before = DROPPED.load(Ordering::Relaxed);
        let mut rec = Record::new("ns/a".into());
        rec.state = Lifecycle::Suspended;
        let rec2 = rec.clone();
        let r = operation(&store, Op::Resume, move || Some(rec2.clone()), async {
            phase("prepare");
            Ok::<_, Error>(7)
        })
        .await;
        assert_eq!(r.unwrap(), 7);
        let failed = operation(&store, Op::Suspend, || Some(rec.clone()), async { Err::<(), _>(Error::Corrupt("x".into())) }).await;
        assert!(matches!(failed, Err(Error::Corrupt(_))), "the operation's own error, untouched");
        // The reports fail in the background and are counted.
        for _ in 0..500 {
            if IN_FLIGHT.load(Ordering::Relaxed) == 0 && DROPPED.load(Ordering::Relaxed) > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(DROPPED.load(Ordering::Relaxed) > before);
    }
}
