//! What the shims report (`ReportLifecycle`): the durations of each phase
//! of a suspend, resume or restore, the outcome of every lifecycle
//! operation and the class of its failure, and each actor's last known
//! state, from which `torpor_actors{state}` is counted at each scrape.
//!
//! Reports arrive fire-and-forget and possibly out of order (each is sent
//! from a task of its own): a state older (by the shim's sequence number)
//! than the one already taken from that shim is ignored. An actor is
//! forgotten when its shim reports it `gone` or its lease is surrendered.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Lifecycle operations a shim reports.
pub const OPS: &[&str] = &["suspend", "resume", "restore", "freeze", "fence_freeze", "commit"];
/// Actor states (`torpor_actors{state}`), as the shim's record names them, lower case.
pub const STATES: &[&str] = &["running", "frozen", "suspending", "suspended", "resuming"];
/// The state that removes an actor from the table.
pub const GONE: &str = "gone";
/// Failure classes (`torpor_lifecycle_failures_total{reason}`).
pub const REASONS: &[&str] = &[
    "store_unavailable",
    "store_not_found",
    "store_corrupt",
    "store_refused",
    "lease",
    "runc",
    "io",
    "corrupt",
    "wrong_state",
    "precondition",
    "invalid",
    "not_found",
    "other",
];
/// The phases each histogram takes (anything else is ignored).
const SUSPEND_PHASES: &[&str] = &["prepare", "freeze", "dump", "fsync", "commit", "upload", "total"];
const RESUME_PHASES: &[&str] = &["prepare", "fetch", "criu_restore", "handover", "total"];
const RESTORE_PHASES: &[&str] = &["fetch", "criu_restore", "total"];
/// At most this many actors are tracked (a node runs far fewer); reports
/// of further ones are counted as refused.
pub const MAX_ACTORS: usize = 65_536;
/// A phase longer than this is not a duration but a bug: ignored.
const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    op: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReportLabels {
    result: &'static str,
}

type Histograms = Family<PhaseLabels, Histogram, fn() -> Histogram>;

/// Buckets from 5 ms to ~82 s (doubling), and +Inf: a freeze takes
/// milliseconds, a dump or a fetch of a large actor tens of seconds.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// One report, as the store API received it.
#[derive(Clone, Debug, Default)]
pub struct Report<'a> {
    pub actor: &'a str,
    pub owner: &'a str,
    pub seq: u64,
    pub op: &'a str,
    pub outcome: &'a str,
    pub reason: &'a str,
    pub phases: Vec<(&'a str, f64)>,
    pub state: &'a str,
    pub dropped: u64,
}

#[derive(Debug)]
struct Known {
    owner: String,
    seq: u64,
    state: &'static str,
}

/// The actors' last known states, counted by state at each scrape.
#[derive(Debug, Default)]
struct ActorTable(Mutex<HashMap<String, Known>>);

impl ActorTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn counts(&self) -> Vec<(&'static str, i64)> {
        let t = self.lock();
        STATES.iter().map(|s| (*s, t.values().filter(|k| k.state == *s).count() as i64)).collect()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

impl Collector for ActorTable {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.counts();
        let mut family = encoder.encode_descriptor(
            "torpor_actors",
            "Actors of this node by lifecycle state (as their shims last reported it)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (state, n) in counts {
            ConstGauge::new(n).encode(family.encode_family(&StateLabels { state })?)?;
        }
        Ok(())
    }
}

/// The lifecycle metrics (see the module doc).
#[derive(Debug)]
pub struct Lifecycle {
    suspend: Histograms,
    resume: Histograms,
    restore: Histograms,
    fetch: Histograms,
    ops: Family<OpLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    reports: Family<ReportLabels, Counter>,
    dropped: Counter,
    actors: std::sync::Arc<ActorTable>,
}

/// `value` if it is one of `known`, else `other`.
fn known(value: &str, known: &[&'static str], other: &'static str) -> &'static str {
    known.iter().copied().find(|k| *k == value).unwrap_or(other)
}

impl Lifecycle {
    /// The metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Lifecycle {
        let h = || Histograms::new_with_constructor(duration_histogram as fn() -> Histogram);
        let l = Lifecycle {
            suspend: h(),
            resume: h(),
            restore: h(),
            fetch: h(),
            ops: Family::default(),
            failures: Family::default(),
            reports: Family::default(),
            dropped: Counter::default(),
            actors: Default::default(),
        };
        registry.register_with_unit(
            "torpor_suspend_duration",
            "Duration of the phases of successful suspends (total: until the memory is freed; commit and upload run after, in the background)",
            prometheus_client::registry::Unit::Seconds,
            l.suspend.clone(),
        );
        registry.register_with_unit(
            "torpor_resume_duration",
            "Duration of the phases of successful resumes of suspended or frozen actors",
            prometheus_client::registry::Unit::Seconds,
            l.resume.clone(),
        );
        registry.register_with_unit(
            "torpor_restore_duration",
            "Duration of the phases of successful restores of a kept snapshot into a new pod",
            prometheus_client::registry::Unit::Seconds,
            l.restore.clone(),
        );
        registry.register_with_unit(
            "torpor_fetch_duration",
            "Duration of fetches of a snapshot from the object tier into the local tier",
            prometheus_client::registry::Unit::Seconds,
            l.fetch.clone(),
        );
        registry.register("torpor_lifecycle_operations", "Lifecycle operations the shims reported, by operation and outcome", l.ops.clone());
        registry.register("torpor_lifecycle_failures", "Failed lifecycle operations, by operation and failure class", l.failures.clone());
        registry.register(
            "torpor_lifecycle_reports",
            "Lifecycle reports received from the shims, by what was done with them (accepted, stale, refused)",
            l.reports.clone(),
        );
        registry.register(
            "torpor_lifecycle_reports_dropped",
            "Lifecycle reports the shims could not deliver (as they told in a later report)",
            l.dropped.clone(),
        );
        registry.register_collector(Box::new(l.actors.clone()));
        l
    }

    fn histograms(&self, op: &str) -> Option<(&Histograms, &'static [&'static str])> {
        match op {
            "suspend" | "commit" => Some((&self.suspend, SUSPEND_PHASES)),
            "resume" => Some((&self.resume, RESUME_PHASES)),
            "restore" => Some((&self.restore, RESTORE_PHASES)),
            _ => None,
        }
    }

    /// Takes one report. Every value becomes a label only if it is one of
    /// the known ones (`other` otherwise); the actor id keys the table only.
    pub fn ingest(&self, r: &Report) {
        self.dropped.inc_by(r.dropped);
        let result = self.take_state(r);
        self.reports.get_or_create(&ReportLabels { result }).inc();
        if r.op.is_empty() {
            return;
        }
        let op = known(r.op, OPS, "other");
        let outcome = if r.outcome == "ok" { "ok" } else { "failed" };
        self.ops.get_or_create(&OpLabels { op, outcome }).inc();
        if outcome == "failed" {
            let reason = known(r.reason, REASONS, "other");
            self.failures.get_or_create(&FailureLabels { op, reason }).inc();
            return;
        }
        let Some((h, phases)) = self.histograms(op) else { return };
        for (name, secs) in &r.phases {
            let Some(phase) = phases.iter().copied().find(|p| p == name) else { continue };
            if secs.is_finite() && *secs >= 0.0 && *secs <= MAX_SECONDS {
                h.get_or_create(&PhaseLabels { phase }).observe(*secs);
            }
        }
    }

    /// The report's state into the table: `accepted`, `stale` (older than
    /// what that shim reported last), or `refused` (bad state, too many actors).
    fn take_state(&self, r: &Report) -> &'static str {
        if r.state.is_empty() {
            return "accepted";
        }
        if r.actor.is_empty() {
            return "refused";
        }
        let mut t = self.actors.lock();
        if r.state == GONE {
            if t.get(r.actor).is_some_and(|k| k.owner == r.owner) {
                t.remove(r.actor);
            }
            return "accepted";
        }
        let Some(state) = STATES.iter().copied().find(|s| *s == r.state) else { return "refused" };
        let full = t.len() >= MAX_ACTORS;
        match t.get_mut(r.actor) {
            Some(k) if k.owner == r.owner && k.seq >= r.seq => "stale",
            Some(k) => {
                *k = Known { owner: r.owner.to_string(), seq: r.seq, state };
                "accepted"
            }
            None if full => "refused",
            None => {
                t.insert(r.actor.to_string(), Known { owner: r.owner.to_string(), seq: r.seq, state });
                "accepted"
            }
        }
    }

    /// The actor left this node (its lease was surrendered by `owner`, or
    /// by anyone when `owner` is empty).
    pub fn forget(&self, actor: &str, owner: &str) {
        let mut t = self.actors.lock();
        if t.get(actor).is_some_and(|k| owner.is_empty() || k.owner == owner) {
            t.remove(actor);
        }
    }

    /// How many actors are known in `state` (tests, status).
    pub fn actors_in(&self, state: &str) -> usize {
        self.actors.counts().into_iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| n as usize)
    }
}

impl torpor_store::Observer for Lifecycle {
    fn uploaded(&self, took: Duration) {
        self.suspend.get_or_create(&PhaseLabels { phase: "upload" }).observe(took.as_secs_f64());
    }

    fn fetched(&self, took: Duration) {
        self.fetch.get_or_create(&PhaseLabels { phase: "total" }).observe(took.as_secs_f64());
    }
}
