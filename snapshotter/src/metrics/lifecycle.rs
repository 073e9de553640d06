//! What the shims report (`ReportLifecycle`): how long each suspend,
//! resume or restore took (by what started it: `trigger`) and each of its
//! phases (a histogram of their own: a sum over phases never counts the
//! total twice), the outcome of every lifecycle operation and the class of
//! its failure, and each actor's last known state, from which
//! `torpor_actors{state}` is counted at each scrape.
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
/// What started a suspend or a resume (`trigger`; the shim's
/// `torpor_runtime::actor::report::Trigger`). Unknown or not told: `other`.
pub const TRIGGERS: &[&str] = &["api", "connection", "exec", "fence", "idle", "request", "stop", "freeze_window", "pressure", "other"];
/// The phases each phase histogram takes (anything else is ignored; a
/// report's `total` goes to the operation's own histogram).
pub const SUSPEND_PHASES: &[&str] = &["prepare", "freeze", "dump", "fsync", "commit", "upload"];
pub const RESUME_PHASES: &[&str] = &["prepare", "fetch", "criu_restore", "handover"];
pub const RESTORE_PHASES: &[&str] = &["fetch", "criu_restore"];
/// The phase whose duration is the whole operation's.
const TOTAL: &str = "total";
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
struct TriggerLabels {
    trigger: &'static str,
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
type ByTrigger = Family<TriggerLabels, Histogram, fn() -> Histogram>;

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
    pub trigger: &'a str,
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
    suspend: ByTrigger,
    suspend_phases: Histograms,
    resume: ByTrigger,
    resume_phases: Histograms,
    restore: Histogram,
    restore_phases: Histograms,
    fetch: Histogram,
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
        let t = || ByTrigger::new_with_constructor(duration_histogram as fn() -> Histogram);
        let l = Lifecycle {
            suspend: t(),
            suspend_phases: h(),
            resume: t(),
            resume_phases: h(),
            restore: duration_histogram(),
            restore_phases: h(),
            fetch: duration_histogram(),
            ops: Family::default(),
            failures: Family::default(),
            reports: Family::default(),
            dropped: Counter::default(),
            actors: Default::default(),
        };
        let seconds = || prometheus_client::registry::Unit::Seconds;
        registry.register_with_unit(
            "torpor_suspend_duration",
            "Duration of successful suspends (until the memory is freed), by what started them",
            seconds(),
            l.suspend.clone(),
        );
        registry.register_with_unit(
            "torpor_suspend_phase_duration",
            "Duration of the phases of successful suspends (commit and upload run after the suspend, in the background)",
            seconds(),
            l.suspend_phases.clone(),
        );
        registry.register_with_unit(
            "torpor_resume_duration",
            "Duration of successful resumes of suspended or frozen actors, by what woke them",
            seconds(),
            l.resume.clone(),
        );
        registry.register_with_unit(
            "torpor_resume_phase_duration",
            "Duration of the phases of successful resumes of suspended actors",
            seconds(),
            l.resume_phases.clone(),
        );
        registry.register_with_unit(
            "torpor_restore_duration",
            "Duration of successful restores of a kept snapshot into a new pod, per container",
            seconds(),
            l.restore.clone(),
        );
        registry.register_with_unit(
            "torpor_restore_phase_duration",
            "Duration of the phases of successful restores of a kept snapshot into a new pod",
            seconds(),
            l.restore_phases.clone(),
        );
        registry.register_with_unit(
            "torpor_fetch_duration",
            "Duration of fetches of a snapshot from the object tier into the local tier",
            seconds(),
            l.fetch.clone(),
        );
        registry.register(
            "torpor_lifecycle_operations",
            "Lifecycle operations the shims reported, by operation and outcome",
            l.ops.clone(),
        );
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

    /// The phase histogram of `op` and its phases.
    fn phase_histograms(&self, op: &str) -> Option<(&Histograms, &'static [&'static str])> {
        match op {
            "suspend" | "commit" => Some((&self.suspend_phases, SUSPEND_PHASES)),
            "resume" => Some((&self.resume_phases, RESUME_PHASES)),
            "restore" => Some((&self.restore_phases, RESTORE_PHASES)),
            _ => None,
        }
    }

    /// A successful `op`'s whole duration (a report's `total`), started by `trigger`.
    fn observe_total(&self, op: &str, trigger: &str, secs: f64) {
        let trigger = known(trigger, TRIGGERS, "other");
        match op {
            "suspend" => self.suspend.get_or_create(&TriggerLabels { trigger }).observe(secs),
            "resume" => self.resume.get_or_create(&TriggerLabels { trigger }).observe(secs),
            "restore" => self.restore.observe(secs),
            _ => {}
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
        let Some((h, phases)) = self.phase_histograms(op) else { return };
        for (name, secs) in &r.phases {
            if !(secs.is_finite() && *secs >= 0.0 && *secs <= MAX_SECONDS) {
                continue;
            }
            if *name == TOTAL {
                self.observe_total(op, r.trigger, *secs);
            } else if let Some(phase) = phases.iter().copied().find(|p| p == name) {
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
        self.suspend_phases.get_or_create(&PhaseLabels { phase: "upload" }).observe(took.as_secs_f64());
    }

    fn fetched(&self, took: Duration) {
        self.fetch.observe(took.as_secs_f64());
    }
}
