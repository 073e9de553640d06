//! The node agent: watches this node's pods (field selector
//! `spec.nodeName`), and for each pod of RuntimeClass torpor brings its
//! actor to the state its [`DESIRED`] annotation asks for, once per
//! request, and reports the actor's state (label, condition, snapshot
//! annotation, Events).
//!
//! Level and edge: what the agent did is recorded on the pod
//! ([`APPLIED`], [`RESULT`]); a restarted agent reads it back and acts only
//! on requests it had not applied yet, and an operation is only run when
//! the actor is not in the asked state already, so a request is never
//! carried out twice. A state change made by another trigger (a request
//! waking a suspended actor, torporctl) is noticed on the next pass
//! (every `resync`) and reported, not undone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde_json::Value;
use torpor_api::annotations::ON_STOP;
use torporctl::control::Op;

use crate::error::{Error, Result};
use crate::metrics::{self, Metrics};
use crate::moves;
use crate::node::{self, Actor};
use crate::report::{self, MetaPatch, Writer};
use crate::resize::{self, Floors, Grow, LeftAlone, Restore, Shrink, REQUESTS, RESTORED};
use crate::state::{self, Desired, Plan, APPLIED, DESIRED, MOVED_FROM, RESULT, RUNTIME_CLASS, STATE_LABEL};

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name (the downward API's `spec.nodeName`).
    pub node: String,
    /// The shims' control sockets on this node.
    pub socket_dir: PathBuf,
    /// How often every pod's actor is looked at (state changes made by
    /// other triggers are seen then).
    pub resync: Duration,
    /// The requests a suspended actor's containers keep (None: requests
    /// are not lowered; lowered ones are still restored).
    pub shrink: Option<Floors>,
    /// Where to serve the agent's Prometheus metrics (None: not served).
    pub metrics_address: Option<SocketAddr>,
    /// How long a woken actor's requests back may stay pending for lack
    /// of room before a pod with `torpor.dev/on-no-room: move` moves
    /// (see [`crate::moves`]).
    pub move_after: Duration,
}

/// What the agent last reported for a pod (by uid): so that a stale copy
/// in the watch cache is not taken for a change made by someone else.
#[derive(Debug, Clone, Default)]
struct Seen {
    label: Option<String>,
    /// The last label of a settled state (not SUSPENDING or RESUMING):
    /// what a change made by another trigger is reported from, so that a
    /// pass that caught the actor mid-resume still reports the resume.
    settled: Option<String>,
    condition: Option<(String, String)>,
}

/// What the agent knows of a pod's requests (by uid), for its Events (one
/// per change) and its gauges.
#[derive(Debug, Clone, Default)]
struct Requests {
    /// Why the requests were left alone (reported once).
    left_alone: Option<&'static str>,
    /// The last resize the API server refused, and when (retried after
    /// [`RESIZE_RETRY`]).
    failed: Option<(String, Instant)>,
    /// Lowered now: the requests given back (memory bytes, CPU cores).
    released: Option<(f64, f64)>,
    /// Awake, its requests not granted back yet: the reason's label, and
    /// since when it is pending for that reason.
    pending: Option<(&'static str, Instant)>,
    /// Why its asked-for move cannot be done (said once).
    not_moved: Option<String>,
}

/// How long a resize the API server refused waits before it is tried again.
const RESIZE_RETRY: Duration = Duration::from_secs(60);

struct Agent {
    cfg: Config,
    writer: Writer,
    seen: HashMap<String, Seen>,
    requests: HashMap<String, Requests>,
    metrics: Arc<Metrics>,
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(client: Client, cfg: Config) -> Result<()> {
    let metrics = Metrics::new();
    if let Some(addr) = cfg.metrics_address {
        metrics::serve(metrics::bind(addr)?, metrics.clone())?;
    }
    let api: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node));
    let (reader, store_writer) = reflector::store::<Pod>();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ObjectRef<Pod>>();
    let stream = reflector::reflector(store_writer, watcher(api.clone(), wc)).default_backoff().applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(pod) => {
                    if tx.send(ObjectRef::from_obj(&pod)).is_err() {
                        return;
                    }
                }
                Err(e) => tracing::warn!("watch of this node's pods: {e}"),
            }
        }
    });
    reader.wait_until_ready().await.map_err(|e| Error::Node(format!("the pod watch ended before its first list: {e}")))?;
    tracing::info!(node = %cfg.node, socket_dir = %cfg.socket_dir.display(), "watching this node's pods");
    let recorder = Recorder::new(client, Reporter { controller: state::MANAGER.into(), instance: Some(cfg.node.clone()) });
    match &cfg.shrink {
        Some(f) => tracing::info!(floors = ?f, "suspended actors' requests are lowered to these floors"),
        None => tracing::info!("suspended actors' requests are not lowered (lowered ones are still restored)"),
    }
    let mut agent = Agent { cfg, writer: Writer { api, recorder }, seen: HashMap::new(), requests: HashMap::new(), metrics };
    // the first pass over every pod: what a restarted agent resyncs
    let pods = reader.state();
    agent.pass(&pods).await;
    tracing::info!(node = %agent.cfg.node, pods = pods.iter().filter(|p| is_torpor_pod(p)).count(), "resynced this node's torpor pods");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| Error::Io { what: "install the SIGTERM handler".into(), source })?;
    let mut tick = tokio::time::interval(agent.cfg.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = rx.recv() => {
                let Some(first) = r else { return Err(Error::Node("the pod watch ended".into())) };
                let mut keys = HashSet::from([first]);
                while let Ok(k) = rx.try_recv() {
                    keys.insert(k);
                }
                let pods: Vec<_> = keys.iter().filter_map(|k| reader.get(k)).collect();
                agent.pass(&pods).await;
            }
            _ = tick.tick() => {
                let pods = reader.state();
                agent.pass(&pods).await;
                let live: HashSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
                agent.seen.retain(|uid, _| live.contains(uid));
                agent.requests.retain(|uid, _| live.contains(uid));
                agent.metrics.set_density(&agent.density());
            }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    tracing::info!("stopping");
    Ok(())
}

/// Is this a pod the agent looks after?
pub fn is_torpor_pod(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()) == Some(RUNTIME_CLASS)
}

/// The actor of `pod` among this node's `actors` (by pod uid, see
/// [`node::actors`]): a pod acts only on the actor its own shim runs.
pub fn actor_of<'a>(pod: &Pod, actors: &'a BTreeMap<String, Actor>) -> Option<&'a Actor> {
    actors.get(pod.metadata.uid.as_deref()?)
}

fn ms(v: &Value, k: &str) -> String {
    v[k].as_u64().map_or_else(|| "-".into(), |m| format!("{m} ms"))
}

impl Agent {
    async fn pass(&mut self, pods: &[std::sync::Arc<Pod>]) {
        let pods: Vec<_> = pods.iter().filter(|p| is_torpor_pod(p)).collect();
        if pods.is_empty() {
            return;
        }
        let actors = match node::actors(&self.cfg.socket_dir).await {
            Ok(a) => a,
            Err(e) => {
                tracing::error!("list the actors of this node: {e}");
                return;
            }
        };
        for pod in pods {
            if let Err(e) = self.reconcile(pod, &actors).await {
                tracing::warn!(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()), "{e}");
            }
        }
        self.metrics.set_density(&self.density());
    }

    /// The gauges of this node's pods' requests.
    fn density(&self) -> metrics::Density {
        let mut d = metrics::Density::default();
        for r in self.requests.values() {
            if let Some((mem, cpu)) = r.released {
                d.shrunk += 1;
                d.released_memory_bytes += mem;
                d.released_cpu_cores += cpu;
            }
            if let Some((reason, _)) = r.pending {
                d.not_restored.push((reason, 1));
            }
        }
        d
    }

    async fn reconcile(&mut self, pod: &Pod, actors: &BTreeMap<String, Actor>) -> Result<()> {
        let Some(actor) = actor_of(pod, actors) else {
            // not started yet, or its shim is gone
            return Ok(());
        };
        let mut actor = actor.clone();
        let mut meta = MetaPatch::default();
        let mut acted = false;
        let desired = pod.annotations().get(DESIRED).cloned();
        let applied = pod.annotations().get(APPLIED).cloned();
        if let Some(want) = desired.filter(|d| applied.as_ref() != Some(d)) {
            match Desired::parse(&want) {
                Err(problem) => {
                    self.writer.event(pod, true, state::INVALID_DESIRED, "Validate", format!("{problem}: nothing done")).await;
                    meta.annotation(pod, APPLIED, Some(&want));
                    meta.annotation(pod, RESULT, Some(&format!("invalid: {want:?} is not one of {}", Desired::VALUES)));
                }
                Ok(d) => {
                    // None: between states, next pass
                    if let Some((result, did)) = self.bring(pod, &mut actor, d).await {
                        acted = did;
                        meta.annotation(pod, APPLIED, Some(&want));
                        meta.annotation(pod, RESULT, Some(&result));
                    }
                }
            }
        }
        let reported = self.report(pod, &actor, meta, acted).await;
        let resized = self.requests_of(pod, &actor).await;
        reported.and(resized)
    }

    /// Lowers the requests of a pod whose actor is suspended, restores
    /// them when it is awake, and reports whether kubelet granted them
    /// (see [`crate::resize`]).
    async fn requests_of(&mut self, pod: &Pod, actor: &Actor) -> Result<()> {
        let uid = pod.uid().unwrap_or_default();
        let entry = self.requests.entry(uid.clone()).or_default();
        if entry.failed.as_ref().is_some_and(|(_, at)| at.elapsed() < RESIZE_RETRY) {
            return Ok(());
        }
        match actor.state() {
            "SUSPENDED" => match self.cfg.shrink.clone() {
                Some(floors) => self.shrink(pod, actor, &uid, &floors).await,
                None => Ok(()),
            },
            // memory resident again (FROZEN: the freeze tier, a fence)
            "RUNNING" | "FROZEN" => self.grow(pod, actor, &uid).await,
            _ => Ok(()),
        }
    }

    async fn shrink(&mut self, pod: &Pod, actor: &Actor, uid: &str, floors: &Floors) -> Result<()> {
        match resize::plan_shrink(pod, floors) {
            Shrink::Nothing => {
                let lowered = match resize::annotated(pod) {
                    Some(Ok(o)) => Some(resize::released(&o, &resize::spec_requests(pod))),
                    _ => None,
                };
                let entry = self.requests.entry(uid.into()).or_default();
                entry.released = lowered;
                entry.pending = None;
                if lowered.is_some() && resize::restored_condition(pod).is_none_or(|(s, r)| s != "False" || r != "Shrunk") {
                    // lowered by an agent that stopped before saying so
                    let message = format!("actor {} is suspended: its requests are lowered (the originals are in {REQUESTS})", actor.id());
                    self.writer.put_condition(pod, RESTORED, "False", "Shrunk", &message).await?;
                }
                Ok(())
            }
            Shrink::LeftAlone(why) => {
                let entry = self.requests.entry(uid.into()).or_default();
                if entry.left_alone != Some(why.label()) {
                    entry.left_alone = Some(why.label());
                    self.metrics.left_alone(why.label());
                    let warning = matches!(why, LeftAlone::BadAnnotation(_));
                    let note = format!("actor {} is suspended; {}", actor.id(), why.message());
                    tracing::info!(actor = %actor.id(), "{note}");
                    self.writer.event(pod, warning, "RequestsKept", "Resize", note).await;
                }
                Ok(())
            }
            Shrink::Resize { originals, target, write_annotation } => {
                if write_annotation {
                    // persisted before acting: whoever comes next restores from it
                    let mut meta = MetaPatch::default();
                    meta.annotation(pod, REQUESTS, Some(&resize::annotation_value(&originals)));
                    self.writer.patch_meta(pod, &meta).await?;
                }
                let now = match self.writer.resize(pod, &target).await {
                    Ok(now) => now,
                    Err(e) => return Err(self.resize_failed(pod, actor, uid, "shrink", e).await),
                };
                self.metrics.resize("shrink", true);
                let change = resize::describe(&originals, &target);
                let unkept = if pod.annotations().get(ON_STOP).map(String::as_str) == Some("suspend") {
                    String::new()
                } else {
                    // woken on a node that filled up, it runs over its requests: kubelet's first pick to evict
                    format!("; without {ON_STOP}: suspend, an eviction after it wakes on a full node would lose what it did since")
                };
                let note = format!(
                    "actor {} is suspended: its requests are lowered, giving its node back to the scheduler ({change}); limits unchanged; the originals, kept in {REQUESTS}, come back when it wakes{unkept}",
                    actor.id()
                );
                tracing::info!(actor = %actor.id(), "{note}");
                self.writer.event(pod, false, "RequestsShrunk", "Resize", note).await;
                let entry = self.requests.entry(uid.into()).or_default();
                entry.failed = None;
                entry.pending = None;
                entry.released = Some(resize::released(&originals, &resize::spec_requests(&now)));
                let message = format!("actor {} is suspended: requests lowered ({change})", actor.id());
                self.writer.put_condition(&now, RESTORED, "False", "Shrunk", &message).await
            }
        }
    }

    async fn grow(&mut self, pod: &Pod, actor: &Actor, uid: &str) -> Result<()> {
        let mut fresh = None;
        match resize::plan_grow(pod) {
            Grow::Nothing => {}
            Grow::BadAnnotation(e) => {
                let why = LeftAlone::BadAnnotation(e);
                let entry = self.requests.entry(uid.into()).or_default();
                if entry.left_alone != Some(why.label()) {
                    entry.left_alone = Some(why.label());
                    self.metrics.left_alone(why.label());
                    self.writer
                        .event(pod, true, "RequestsKept", "Resize", format!("actor {} is awake; {}", actor.id(), why.message()))
                        .await;
                }
                return Ok(());
            }
            Grow::Done => {
                let mut meta = MetaPatch::default();
                meta.annotation(pod, REQUESTS, None);
                self.writer.patch_meta(pod, &meta).await?;
            }
            Grow::Resize { target } => {
                let before = resize::spec_requests(pod);
                let now = match self.writer.resize(pod, &target).await {
                    Ok(now) => now,
                    Err(e) => return Err(self.resize_failed(pod, actor, uid, "grow", e).await),
                };
                self.metrics.resize("grow", true);
                let note = format!("actor {} is awake: its requests are asked back ({})", actor.id(), resize::describe(&before, &target));
                tracing::info!(actor = %actor.id(), "{note}");
                self.writer.event(pod, false, "RequestsRestoring", "Resize", note).await;
                // the spec has them: the annotation has done its work
                let mut meta = MetaPatch::default();
                meta.annotation(&now, REQUESTS, None);
                self.writer.patch_meta(&now, &meta).await?;
                fresh = Some(now);
            }
        }
        let entry = self.requests.entry(uid.into()).or_default();
        entry.failed = None;
        entry.released = None;
        let p = fresh.as_ref().unwrap_or(pod);
        // Follow a resize up until kubelet granted it: it was just asked,
        // or the pod says it is not granted yet.
        let following = fresh.is_some() || resize::restored_condition(p).is_some_and(|(s, _)| s != "True");
        if !following {
            entry.pending = None;
            return Ok(());
        }
        match resize::restore_status(p) {
            Restore::Restored => {
                entry.pending = None;
                if resize::restored_condition(p).is_none_or(|(s, _)| s != "True") {
                    let note = format!("actor {} is awake and kubelet runs it with its own requests again", actor.id());
                    self.writer.event(pod, false, "RequestsRestored", "Resize", note.clone()).await;
                    self.writer.put_condition(p, RESTORED, "True", "Restored", &note).await?;
                }
                Ok(())
            }
            Restore::Pending { reason, message } => {
                let label = Restore::label(reason);
                let was = entry.pending.map(|(l, _)| l);
                let since = match entry.pending {
                    Some((l, since)) if l == label => since,
                    _ => Instant::now(),
                };
                entry.pending = Some((label, since));
                let on_pod = resize::restored_condition(p);
                if was == Some(label) && on_pod.as_ref().is_some_and(|(s, r)| s == "False" && r == reason) {
                    return self.move_if_asked(p, actor, uid, reason, since).await;
                }
                let note = format!(
                    "actor {} is awake and keeps running on its lowered requests: its requests back are {} by kubelet{}",
                    actor.id(),
                    match reason {
                        "Deferred" => "deferred (the node has no room for them now; kubelet retries)",
                        "Infeasible" => "infeasible (the node can never fit them)",
                        "Error" => "failing",
                        "InProgress" => "being applied",
                        _ => "not taken yet",
                    },
                    if message.is_empty() { String::new() } else { format!(": {message}") }
                );
                if was != Some(label) && matches!(reason, "Deferred" | "Infeasible" | "Error") {
                    tracing::warn!(actor = %actor.id(), "{note}");
                    let ev = match reason {
                        "Deferred" => "ResizeDeferred",
                        "Infeasible" => "ResizeInfeasible",
                        _ => "ResizeFailed",
                    };
                    self.writer.event(pod, true, ev, "Resize", note.clone()).await;
                }
                if on_pod.is_none_or(|(s, r)| s != "False" || r != reason) {
                    self.writer.put_condition(p, RESTORED, "False", reason, &note).await?;
                }
                self.move_if_asked(p, actor, uid, reason, since).await
            }
        }
    }

    /// The `torpor.dev/on-no-room` policy of an awake actor whose requests
    /// back have been pending for `reason` since `since` (see
    /// [`crate::moves`]): suspend it, then delete its pod for its
    /// controller to create it again where the scheduler finds room.
    async fn move_if_asked(&mut self, pod: &Pod, actor: &Actor, uid: &str, reason: &str, since: Instant) -> Result<()> {
        let plan = match moves::plan(pod, reason, since.elapsed(), self.cfg.move_after) {
            moves::Plan::Move { controller } => match self.writer.budgets(pod).await {
                Ok(budgets) => moves::budget_refusal(pod, &budgets).map_or(moves::Plan::Move { controller }, moves::Plan::Cannot),
                Err(e) => moves::Plan::Cannot(format!("its PodDisruptionBudgets cannot be read ({e}): it stays")),
            },
            plan => plan,
        };
        let controller = match plan {
            moves::Plan::Stay | moves::Plan::NotYet => return Ok(()),
            moves::Plan::Cannot(why) => {
                let entry = self.requests.entry(uid.into()).or_default();
                if entry.not_moved.as_deref() != Some(why.as_str()) {
                    entry.not_moved = Some(why.clone());
                    self.metrics.moved("refused");
                    let note = format!("actor {} has no room for its requests here; {why}", actor.id());
                    tracing::warn!(actor = %actor.id(), "{note}");
                    self.writer.event(pod, true, "NotMoved", "Move", note).await;
                }
                return Ok(());
            }
            moves::Plan::Move { controller } => controller,
        };
        let note = format!(
            "actor {} is awake but node {} has no room for its requests ({reason} for {} s): suspending it and deleting its pod; {controller} creates it again where the scheduler finds room, and it continues there from its snapshot",
            actor.id(),
            self.cfg.node,
            since.elapsed().as_secs()
        );
        tracing::info!(actor = %actor.id(), "{note}");
        self.writer.event(pod, false, "Moving", "Move", note).await;
        let t0 = Instant::now();
        // a failed move is tried again after another move_after, not on every pass
        if let Some((_, since)) = &mut self.requests.entry(uid.into()).or_default().pending {
            *since = Instant::now();
        }
        if let Err(e) = node::call(actor, Op::Suspend).await {
            self.metrics.moved("failed");
            let note = format!("move of actor {}: its suspend failed, it keeps running here: {e}", actor.id());
            self.writer.event(pod, true, "MoveFailed", "Move", note.clone()).await;
            return Err(Error::Node(note));
        }
        let suspended_ms = t0.elapsed().as_millis();
        // suspended: whatever happens to the pod now, its state is kept
        if let Err(e) = self.writer.delete(pod).await {
            self.metrics.moved("failed");
            let note = format!(
                "move of actor {}: suspended here in {suspended_ms} ms, but deleting its pod failed (it stays suspended here): {e}",
                actor.id()
            );
            self.writer.event(pod, true, "MoveFailed", "Move", note).await;
            return Err(e);
        }
        self.metrics.moved("moved");
        tracing::info!(actor = %actor.id(), suspended_ms, %controller, "suspended and its pod deleted: moving");
        self.requests.remove(uid);
        Ok(())
    }

    /// A resize the API server refused: counted, said once per distinct
    /// error (a Warning Event), tried again after [`RESIZE_RETRY`].
    async fn resize_failed(&mut self, pod: &Pod, actor: &Actor, uid: &str, direction: &'static str, e: Error) -> Error {
        self.metrics.resize(direction, false);
        let msg = e.to_string();
        let entry = self.requests.entry(uid.into()).or_default();
        let repeated = entry.failed.as_ref().is_some_and(|(m, _)| *m == msg);
        entry.failed = Some((msg.clone(), Instant::now()));
        if !repeated {
            let what = if direction == "shrink" { "lowering the requests of the suspended" } else { "restoring the requests of the awake" };
            let note = format!("{what} actor {} failed (tried again in {} s): {msg}", actor.id(), RESIZE_RETRY.as_secs());
            self.writer.event(pod, true, "ResizeFailed", "Resize", note).await;
        }
        e
    }

    /// Runs the operations that take `actor` to `d`. Some((result, whether
    /// an operation ran)) when done (or failed), None to look again later.
    async fn bring(&self, pod: &Pod, actor: &mut Actor, d: Desired) -> Option<(String, bool)> {
        let mut did = Vec::new();
        // at most two steps (frozen from suspended: resume, then freeze)
        for _ in 0..3 {
            match state::plan(d, actor.state()) {
                Plan::Done => {
                    let result = if did.is_empty() { format!("ok: already {}", d.as_str()) } else { format!("ok: {}", did.join(", ")) };
                    return Some((result, !did.is_empty()));
                }
                Plan::Wait => return None,
                Plan::Run(op) => {
                    let from = actor.state().to_string();
                    let (ok_reason, fail_reason) = state::event_reasons(op, &from);
                    let t0 = Instant::now();
                    let r = node::call(actor, op).await;
                    let took = t0.elapsed().as_millis();
                    match r {
                        Ok(rec) => {
                            actor.record = rec;
                            let note = note_of(op, actor, took, d);
                            tracing::info!(actor = %actor.id(), "{note}");
                            self.writer.event(pod, false, ok_reason, op.name(), note).await;
                            did.push(format!("{} in {took} ms", op.name()));
                        }
                        Err(e) => {
                            let note = format!(
                                "{} of actor {} (asked by {DESIRED}={}) failed after {took} ms: {e}",
                                op.name(),
                                actor.id(),
                                d.as_str()
                            );
                            tracing::warn!("{note}");
                            self.writer.event(pod, true, fail_reason, op.name(), note).await;
                            // its state now, for the label
                            if let Ok(all) = node::actors(&self.cfg.socket_dir).await {
                                if let Some(a) = actor.pod_uid().and_then(|uid| all.get(uid)) {
                                    *actor = a.clone();
                                }
                            }
                            return Some((format!("failed: {}: {e}", op.name()), true));
                        }
                    }
                }
            }
        }
        Some((format!("failed: {} not reached (state {})", d.as_str(), actor.state()), !did.is_empty()))
    }

    /// Brings the label, the snapshot annotation and the condition up to the
    /// actor's state, with `meta` (the applied-state annotations) in the
    /// same patch; reports a change that another trigger made.
    async fn report(&mut self, pod: &Pod, actor: &Actor, mut meta: MetaPatch, acted: bool) -> Result<()> {
        let uid = pod.uid().unwrap_or_default();
        let seen = self.seen.entry(uid.clone()).or_insert_with(|| Seen {
            label: pod.labels().get(STATE_LABEL).cloned(),
            settled: pod.labels().get(STATE_LABEL).cloned(),
            condition: report::condition(pod),
        });
        let label = state::label_value(actor.state());
        let before = seen.label.clone();
        let settled = !state::is_transient(actor.state());
        if !acted && settled {
            if let Some(before) = seen.settled.as_deref().filter(|b| *b != label) {
                let (reason, note) = match (before, label.as_str()) {
                    ("suspended", "running") => (
                        "Resumed",
                        format!(
                            "actor {} resumed by another trigger (a request, torporctl): restore {}",
                            actor.id(),
                            ms(&actor.record, "last_resume_ms")
                        ),
                    ),
                    (_, "suspended") => (
                        "Suspended",
                        format!("actor {} suspended by another trigger (torporctl): {}", actor.id(), ms(&actor.record, "last_suspend_ms")),
                    ),
                    (b, l) => ("StateChanged", format!("actor {} went from {b} to {l}", actor.id())),
                };
                self.writer.event(pod, false, reason, "Observe", note).await;
            }
        }
        let r = &actor.record;
        let reported = pod.annotations().get(MOVED_FROM).map(String::as_str);
        if let Some(from) = state::moved_from(actor.state(), r["moved_from"].as_str(), r["recovered_from"].as_str(), reported) {
            let note = format!(
                "actor {} moved here from node {from} with its state: restored from snapshot {} {}",
                actor.id(),
                r["recovered_from"].as_str().unwrap_or("-"),
                ms(r, "last_resume_ms")
            );
            self.writer.event(pod, false, "Moved", "Restore", note).await;
            meta.annotation(pod, MOVED_FROM, Some(from));
        }
        let fresh = report::state_patch(pod, actor.state(), actor.snapshot().as_deref());
        meta.labels.extend(fresh.labels);
        meta.annotations.extend(fresh.annotations);
        // the cached pod may be older than what was written last
        if before.as_deref() != Some(label.as_str()) && !meta.labels.contains_key(STATE_LABEL) {
            meta.labels.insert(STATE_LABEL.into(), Value::String(label.clone()));
        }
        self.writer.patch_meta(pod, &meta).await?;
        let (status, reason) = report::condition_for(actor.state());
        let want = (status.to_string(), reason);
        let seen = self.seen.entry(uid).or_default();
        if settled {
            seen.settled = Some(label.clone());
        }
        seen.label = Some(label);
        if seen.condition.as_ref() != Some(&want) {
            let message = match actor.snapshot() {
                Some(s) if status == "True" => format!("actor {} is suspended; its state is in snapshot {s}", actor.id()),
                _ => format!("actor {} is {}", actor.id(), state::label_value(actor.state())),
            };
            self.writer.set_condition(pod, actor.state(), &message).await?;
            seen.condition = Some(want);
        }
        Ok(())
    }
}

/// The note of a successful operation's Event: the timings.
fn note_of(op: Op, actor: &Actor, took: u128, d: Desired) -> String {
    let r = &actor.record;
    let shim = match op {
        Op::Suspend => format!(", checkpoint {} in the shim", ms(r, "last_suspend_ms")),
        Op::Resume => format!(", restore {} in the shim", ms(r, "last_resume_ms")),
        Op::Freeze => String::new(),
    };
    let snap = actor.snapshot().map(|s| format!(", snapshot {s}")).unwrap_or_default();
    format!(
        "{} of actor {} (asked by {DESIRED}={}) took {took} ms{shim}; generation {}{snap}",
        op.name(),
        actor.id(),
        d.as_str(),
        r["generation"].as_u64().unwrap_or(0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ACTOR;

    #[test]
    fn pods_and_their_actors() {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("ns".into());
        assert!(!is_torpor_pod(&p));
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec { runtime_class_name: Some("torpor".into()), ..Default::default() });
        assert!(is_torpor_pod(&p));

        let actor = |id: &str, uid: &str| Actor {
            sock: format!("/run/torpor/shims/{uid}.sock").into(),
            record: serde_json::json!({"actor": id, "state": "RUNNING", "pod_uid": uid}),
        };
        let actors: BTreeMap<String, Actor> = [("uid-a", actor("ns/web", "uid-a")), ("uid-b", actor("team-b/secret", "uid-b"))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert!(actor_of(&p, &actors).is_none(), "a pod without a uid has no actor");
        p.metadata.uid = Some("uid-a".into());
        assert_eq!(actor_of(&p, &actors).map(Actor::id), Some("ns/web"));
        // Its annotation naming another namespace's actor changes nothing
        // (issue 38, row 3).
        p.metadata.annotations = Some([(ACTOR.to_string(), "team-b/secret".to_string())].into());
        assert_eq!(actor_of(&p, &actors).map(Actor::id), Some("ns/web"));
        p.metadata.uid = Some("uid-c".into());
        assert!(actor_of(&p, &actors).is_none(), "a pod whose shim runs no actor acts on none");
    }
}
