//! A sleeping actor gives its node back to the scheduler (issue 42): the
//! decisions, as pure functions of the pod, unit-tested without a cluster.
//!
//! Once a pod's actor is SUSPENDED (its memory freed: after the freeze
//! tier's window, if any), the agent lowers its containers' CPU and memory
//! *requests* to [`Floors`] through the `pods/resize` subresource
//! (in-place pod resize), so that the scheduler can place other pods in
//! what the actor no longer uses. Limits are never changed, so a resume
//! never waits for the API server: the actor wakes within its limits and
//! the agent asks for its requests back afterwards.
//!
//! - The original requests are written first, into the agent's own
//!   annotation [`REQUESTS`] (persist before acting): a restarted agent,
//!   or one that failed half-way, finds them there.
//! - A Guaranteed pod (requests equal to limits) is left alone: lowering a
//!   request would change its QoS class, which the API server refuses. So
//!   is a pod with pod-level resources, and a resource whose container's
//!   `resizePolicy` restarts it ([`LeftAlone`]).
//! - On a resume, the original requests are restored and the annotation
//!   removed; whether kubelet could grant them is read from the pod's
//!   conditions `PodResizePending` (Deferred, Infeasible) and
//!   `PodResizeInProgress` ([`restore_status`]), reported as the
//!   condition [`RESTORED`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{json, Value};

pub use torpor_api::annotations::REQUESTS;

/// The pod condition: False while the pod's requests are lowered (reason
/// `Shrunk`) or not granted back yet (`Deferred`, `Infeasible`,
/// `InProgress`, `Error`, `Waiting`); True (`Restored`) once kubelet runs
/// the pod with its own requests again.
pub const RESTORED: &str = "torpor.dev/RequestsRestored";

/// The resources whose requests are lowered.
pub const RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Requests by container name, then resource name: the quantity as the
/// pod spells it.
pub type Requests = BTreeMap<String, BTreeMap<String, String>>;

/// A quantity (`500m`, `0.5`, `512Mi`, `1G`, `1e3`) in billionths of its
/// unit: exact for what pods hold. None when it does not parse.
pub fn parse_quantity(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
    {
        return None;
    }
    // the number in billionths
    let mut v: i128 = if int.is_empty() { 0 } else { int.parse::<i128>().ok()? };
    v = v.checked_mul(1_000_000_000)?;
    if !frac.is_empty() {
        v += frac.parse::<i128>().ok()? * 10i128.pow(9 - frac.len() as u32);
    }
    let scaled = match suffix {
        "" => v,
        "n" => v / 1_000_000_000,
        "u" => v / 1_000_000,
        "m" => v / 1_000,
        "k" => v.checked_mul(1_000)?,
        "M" => v.checked_mul(1_000_000)?,
        "G" => v.checked_mul(1_000_000_000)?,
        "T" => v.checked_mul(1_000_000_000_000)?,
        "P" => v.checked_mul(1_000_000_000_000_000)?,
        "E" => v.checked_mul(1_000_000_000_000_000_000)?,
        "Ki" => v.checked_mul(1 << 10)?,
        "Mi" => v.checked_mul(1 << 20)?,
        "Gi" => v.checked_mul(1 << 30)?,
        "Ti" => v.checked_mul(1 << 40)?,
        "Pi" => v.checked_mul(1 << 50)?,
        "Ei" => v.checked_mul(1 << 60)?,
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            if exp >= 0 {
                v.checked_mul(10i128.checked_pow(u32::try_from(exp).ok()?)?)?
            } else {
                v / 10i128.checked_pow(u32::try_from(-exp).ok()?)?
            }
        }
        _ => return None,
    };
    Some(if neg { -scaled } else { scaled })
}

/// Whether two quantities are the same amount (`1Gi` and `1073741824`).
pub fn same_quantity(a: &str, b: &str) -> bool {
    match (parse_quantity(a), parse_quantity(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The requests a suspended actor's containers keep (the agent's
/// `--cpu-floor` and `--memory-floor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floors {
    cpu: String,
    memory: String,
    cpu_n: i128,
    memory_n: i128,
}

impl Floors {
    /// Default CPU floor: the smallest request that still gives the
    /// container a CPU share of its own (cpu.shares 10).
    pub const CPU: &'static str = "10m";
    /// Default memory floor: what a suspended actor's pod still holds
    /// (BENCHMARKS.md `suspended_actor_mib`, 1.95 MiB with the shim, whose
    /// own memory the RuntimeClass's `overhead` accounts for), with room.
    pub const MEMORY: &'static str = "4Mi";

    pub fn new(cpu: &str, memory: &str) -> Result<Floors, String> {
        let check = |what: &str, q: &str| match parse_quantity(q) {
            Some(n) if n > 0 => Ok(n),
            _ => Err(format!("{what} floor {q:?} is not a positive Kubernetes quantity (e.g. {}, {})", Floors::CPU, Floors::MEMORY)),
        };
        Ok(Floors { cpu_n: check("CPU", cpu)?, memory_n: check("memory", memory)?, cpu: cpu.into(), memory: memory.into() })
    }

    /// The floor of `resource` (one of [`RESOURCES`]): as written, in billionths.
    fn of(&self, resource: &str) -> Option<(&str, i128)> {
        match resource {
            "cpu" => Some((&self.cpu, self.cpu_n)),
            "memory" => Some((&self.memory, self.memory_n)),
            _ => None,
        }
    }
}

impl Default for Floors {
    fn default() -> Self {
        Floors { cpu: Floors::CPU.into(), memory: Floors::MEMORY.into(), cpu_n: 10_000_000, memory_n: (4i128 << 20) * 1_000_000_000 }
    }
}

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The pod's QoS class: the API server's (`status.qosClass`), else
/// computed as Kubernetes does (every container, init containers too,
/// with CPU and memory limits equal to its requests: Guaranteed; no
/// request or limit anywhere: BestEffort).
pub fn qos(pod: &Pod) -> Qos {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => return Qos::Guaranteed,
        Some("Burstable") => return Qos::Burstable,
        Some("BestEffort") => return Qos::BestEffort,
        _ => {}
    }
    let Some(spec) = pod.spec.as_ref() else { return Qos::BestEffort };
    let all: Vec<&Container> = spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        for res in RESOURCES {
            let req = requests.and_then(|m| m.get(res)).map(|q| q.0.as_str());
            let lim = limits.and_then(|m| m.get(res)).map(|q| q.0.as_str());
            if req.is_some_and(|q| parse_quantity(q) != Some(0)) || lim.is_some() {
                any = true;
            }
            // an unset request defaults to the limit
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(q), Some(l)) if !same_quantity(q, l) => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        Qos::BestEffort
    } else if guaranteed {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

/// Why a suspended actor's pod keeps its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftAlone {
    /// Requests equal limits: a lower request would change the pod's QoS
    /// class, which the API server refuses.
    Guaranteed,
    /// `spec.resources` (pod-level resources): not resized in place.
    PodLevelResources,
    /// These `container/resource` would be resized by restarting the
    /// container (`resizePolicy` `RestartContainer`).
    RestartPolicy(Vec<String>),
    /// The agent's annotation does not parse (someone changed it).
    BadAnnotation(String),
}

impl LeftAlone {
    /// The metric label and the Event's wording key.
    pub fn label(&self) -> &'static str {
        match self {
            LeftAlone::Guaranteed => "guaranteed",
            LeftAlone::PodLevelResources => "pod_level_resources",
            LeftAlone::RestartPolicy(_) => "restart_policy",
            LeftAlone::BadAnnotation(_) => "bad_annotation",
        }
    }

    pub fn message(&self) -> String {
        match self {
            LeftAlone::Guaranteed => {
                "the pod is Guaranteed QoS (its requests equal its limits): lowering its requests while its actor sleeps \
                 would change its QoS class, which Kubernetes refuses; its requests stay (set requests below limits to let them shrink)"
                    .into()
            }
            LeftAlone::PodLevelResources => {
                "the pod has pod-level resources (spec.resources), which torpor does not resize in place: its requests stay".into()
            }
            LeftAlone::RestartPolicy(which) => {
                format!("resizing {} would restart the container (resizePolicy RestartContainer): its requests stay", which.join(", "))
            }
            LeftAlone::BadAnnotation(e) => format!("the annotation {REQUESTS} does not parse ({e}): requests left as they are"),
        }
    }
}

/// What to do for a pod whose actor is suspended.
#[derive(Debug, Clone, PartialEq)]
pub enum Shrink {
    /// Nothing above the floors (or lowered already).
    Nothing,
    LeftAlone(LeftAlone),
    /// Write [`REQUESTS`] = `originals` (unless it is there already), then
    /// resize the pod's requests to `target`.
    Resize {
        originals: Requests,
        target: Requests,
        write_annotation: bool,
    },
}

/// The CPU and memory requests of the pod's (app) containers, as the spec has them.
pub fn spec_requests(pod: &Pod) -> Requests {
    let mut out = Requests::new();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let reqs = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let m: BTreeMap<String, String> = RESOURCES.iter().filter_map(|r| Some((r.to_string(), reqs?.get(*r)?.0.clone()))).collect();
        out.insert(c.name.clone(), m);
    }
    out
}

/// The annotation's requests, if the pod has it: Err when it does not parse.
pub fn annotated(pod: &Pod) -> Option<Result<Requests, String>> {
    let v = pod.metadata.annotations.as_ref()?.get(REQUESTS)?;
    Some(serde_json::from_str::<Requests>(v).map_err(|e| e.to_string()).and_then(|r| {
        match r.values().flat_map(|m| m.iter()).find(|(res, q)| !RESOURCES.contains(&res.as_str()) || parse_quantity(q).is_none()) {
            Some((res, q)) => Err(format!("{res}: {q:?} is not a CPU or memory quantity")),
            None => Ok(r),
        }
    }))
}

/// The annotation's value for `originals`.
pub fn annotation_value(originals: &Requests) -> String {
    serde_json::to_string(originals).unwrap_or_default()
}

fn restart_policy<'a>(c: &'a Container, resource: &str) -> Option<&'a str> {
    c.resize_policy.as_ref()?.iter().find(|p| p.resource_name == resource).map(|p| p.restart_policy.as_str())
}

/// Whether the spec has `want`'s requests (each container, each resource).
fn spec_has(spec: &Requests, want: &Requests) -> bool {
    want.iter().all(|(c, rs)| rs.iter().all(|(r, q)| spec.get(c).and_then(|m| m.get(r)).is_some_and(|have| same_quantity(have, q))))
}

/// The decision for a pod whose actor is suspended.
pub fn plan_shrink(pod: &Pod, floors: &Floors) -> Shrink {
    let spec = spec_requests(pod);
    if let Some(a) = annotated(pod) {
        // Lowered already, or half-way (the annotation written, the resize
        // not done): the annotation has the originals.
        let originals = match a {
            Ok(o) => o,
            Err(e) => return Shrink::LeftAlone(LeftAlone::BadAnnotation(e)),
        };
        let target: Requests = originals
            .iter()
            .filter(|(c, _)| spec.contains_key(*c))
            .map(|(c, rs)| {
                let lowered = rs
                    .iter()
                    .map(|(r, q)| {
                        let v = match floors.of(r) {
                            Some((f, n)) if parse_quantity(q).is_some_and(|v| v > n) => f.to_string(),
                            _ => q.clone(),
                        };
                        (r.clone(), v)
                    })
                    .collect();
                (c.clone(), lowered)
            })
            .collect();
        if spec_has(&spec, &target) {
            return Shrink::Nothing;
        }
        return Shrink::Resize { originals, target, write_annotation: false };
    }
    if qos(pod) == Qos::Guaranteed {
        return Shrink::LeftAlone(LeftAlone::Guaranteed);
    }
    let pod_level = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .is_some_and(|r| r.requests.as_ref().is_some_and(|m| !m.is_empty()) || r.limits.as_ref().is_some_and(|m| !m.is_empty()));
    if pod_level {
        return Shrink::LeftAlone(LeftAlone::PodLevelResources);
    }
    let mut originals = Requests::new();
    let mut target = Requests::new();
    let mut restart = Vec::new();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        for r in RESOURCES {
            let Some(q) = spec.get(&c.name).and_then(|m| m.get(r)) else { continue };
            let Some((floor, floor_n)) = floors.of(r) else { continue };
            if parse_quantity(q).is_none_or(|v| v <= floor_n) {
                continue;
            }
            if restart_policy(c, r) == Some("RestartContainer") {
                restart.push(format!("{}/{r}", c.name));
                continue;
            }
            originals.entry(c.name.clone()).or_default().insert(r.to_string(), q.clone());
            target.entry(c.name.clone()).or_default().insert(r.to_string(), floor.to_string());
        }
    }
    if originals.is_empty() {
        return if restart.is_empty() { Shrink::Nothing } else { Shrink::LeftAlone(LeftAlone::RestartPolicy(restart)) };
    }
    Shrink::Resize { originals, target, write_annotation: true }
}

/// What to do for a pod whose actor is awake (RUNNING or FROZEN).
#[derive(Debug, Clone, PartialEq)]
pub enum Grow {
    /// The pod has no [`REQUESTS`] annotation.
    Nothing,
    /// The spec has the original requests: remove the annotation.
    Done,
    /// Resize the pod's requests back to `target`, then remove the annotation.
    Resize { target: Requests },
    /// The annotation does not parse: nothing can be restored from it.
    BadAnnotation(String),
}

/// The decision for a pod whose actor is awake: its original requests
/// back, never above the container's limit (a limit lowered meanwhile by
/// someone else wins) and only for containers it still has.
pub fn plan_grow(pod: &Pod) -> Grow {
    let originals = match annotated(pod) {
        None => return Grow::Nothing,
        Some(Err(e)) => return Grow::BadAnnotation(e),
        Some(Ok(o)) => o,
    };
    let spec = spec_requests(pod);
    let mut target = Requests::new();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let Some(rs) = originals.get(&c.name) else { continue };
        let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
        for (r, q) in rs {
            let capped = match limits.and_then(|l| l.get(r)) {
                Some(l) if parse_quantity(&l.0) < parse_quantity(q) => l.0.clone(),
                _ => q.clone(),
            };
            target.entry(c.name.clone()).or_default().insert(r.clone(), capped);
        }
    }
    if spec_has(&spec, &target) {
        Grow::Done
    } else {
        Grow::Resize { target }
    }
}

/// The body of the `pods/resize` patch (strategic merge: containers by
/// name, requests by resource; limits untouched).
pub fn resize_patch(target: &Requests) -> Value {
    let containers: Vec<Value> = target.iter().map(|(c, rs)| json!({"name": c, "resources": {"requests": rs}})).collect();
    json!({"spec": {"containers": containers}})
}

/// Whether kubelet runs the pod with the requests its spec asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    Restored,
    /// Not yet: `reason` is the condition's reason (`Deferred`,
    /// `Infeasible`: `PodResizePending`; `InProgress`, `Error`:
    /// `PodResizeInProgress`; `Waiting`: kubelet has not taken the new
    /// spec yet), `message` kubelet's words.
    Pending {
        reason: &'static str,
        message: String,
    },
}

impl Restore {
    /// The metric label of a pending reason.
    pub fn label(reason: &str) -> &'static str {
        match reason {
            "Deferred" => "deferred",
            "Infeasible" => "infeasible",
            "InProgress" => "in_progress",
            "Error" => "error",
            _ => "waiting",
        }
    }
}

/// Reads whether the pod's requests are granted: kubelet's resize
/// conditions, then each container's status (`resources.requests`, what
/// kubelet actuated) against the spec.
pub fn restore_status(pod: &Pod) -> Restore {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let cond = |t: &str| conditions.and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"));
    if let Some(c) = cond("PodResizePending") {
        let reason = match c.reason.as_deref() {
            Some("Infeasible") => "Infeasible",
            _ => "Deferred",
        };
        return Restore::Pending { reason, message: c.message.clone().unwrap_or_default() };
    }
    if let Some(c) = cond("PodResizeInProgress") {
        let reason = if c.reason.as_deref() == Some("Error") { "Error" } else { "InProgress" };
        return Restore::Pending { reason, message: c.message.clone().unwrap_or_default() };
    }
    let spec = spec_requests(pod);
    for cs in pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()) {
        let Some(have) = cs.resources.as_ref().and_then(|r| r.requests.as_ref()) else { continue };
        for (r, want) in spec.get(&cs.name).into_iter().flatten() {
            if have.get(r).is_some_and(|q| !same_quantity(&q.0, want)) {
                return Restore::Pending {
                    reason: "Waiting",
                    message: format!("kubelet has not applied the new requests yet (container {}: {r} {} of {want})", cs.name, have[r].0),
                };
            }
        }
    }
    Restore::Restored
}

/// The pod's [`RESTORED`] condition: (status, reason), if it has it.
pub fn restored_condition(pod: &Pod) -> Option<(String, String)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == RESTORED)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// The requests given back while lowered: (memory bytes, CPU cores), the
/// originals less what the spec has now.
pub fn released(originals: &Requests, spec: &Requests) -> (f64, f64) {
    let mut out = (0i128, 0i128);
    for (c, rs) in originals {
        for (r, q) in rs {
            let now = spec.get(c).and_then(|m| m.get(r)).and_then(|q| parse_quantity(q));
            let (Some(was), Some(now)) = (parse_quantity(q), now) else { continue };
            let d = (was - now).max(0);
            match r.as_str() {
                "memory" => out.0 += d,
                "cpu" => out.1 += d,
                _ => {}
            }
        }
    }
    (out.0 as f64 / 1e9, out.1 as f64 / 1e9)
}

/// A short account of a change of requests, for Events:
/// `app: cpu 500m -> 10m, memory 512Mi -> 4Mi`.
pub fn describe(from: &Requests, to: &Requests) -> String {
    let mut parts = Vec::new();
    for (c, rs) in to {
        let changes: Vec<String> =
            rs.iter().map(|(r, q)| format!("{r} {} -> {q}", from.get(c).and_then(|m| m.get(r)).map_or("-", String::as_str))).collect();
        parts.push(format!("{c}: {}", changes.join(", ")));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerResizePolicy, ContainerStatus, PodCondition, PodSpec, PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn q(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements { requests: q(requests), limits: q(limits), ..Default::default() }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("actor-0".into());
        p.spec = Some(PodSpec { containers, runtime_class_name: Some("torpor".into()), ..Default::default() });
        p
    }

    fn reqs(v: Value) -> Requests {
        serde_json::from_value(v).unwrap()
    }

    fn with_annotation(mut p: Pod, v: &str) -> Pod {
        p.metadata.annotations = Some([(REQUESTS.to_string(), v.to_string())].into());
        p
    }

    /// What the API server would make of the resize patch (requests only).
    fn resized(mut p: Pod, target: &Requests) -> Pod {
        for c in p.spec.as_mut().unwrap().containers.iter_mut() {
            if let Some(rs) = target.get(&c.name) {
                let r = c.resources.get_or_insert_with(Default::default).requests.get_or_insert_with(Default::default);
                for (k, v) in rs {
                    r.insert(k.clone(), Quantity(v.clone()));
                }
            }
        }
        p
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m"), Some(500_000_000));
        assert_eq!(parse_quantity("0.5"), parse_quantity("500m"));
        assert_eq!(parse_quantity("1"), Some(1_000_000_000));
        assert_eq!(parse_quantity("512Mi"), Some((512i128 << 20) * 1_000_000_000));
        assert_eq!(parse_quantity("1Gi"), parse_quantity("1073741824"));
        assert_eq!(parse_quantity("1G"), parse_quantity("1e9"));
        assert_eq!(parse_quantity("1.5Gi"), parse_quantity("1536Mi"));
        assert_eq!(parse_quantity("2k"), parse_quantity("2000"));
        assert_eq!(parse_quantity("100u"), Some(100_000));
        assert!(same_quantity("1024Mi", "1Gi") && !same_quantity("1000Mi", "1Gi"));
        for bad in ["", "Mi", "1.2.3", "12X", "1e", "abc", "1.0000000001"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
        assert_eq!(Floors::default(), Floors::new(Floors::CPU, Floors::MEMORY).unwrap());
        assert!(Floors::new("0", "4Mi").is_err() && Floors::new("10m", "lots").is_err());
    }

    #[test]
    fn qos_classes() {
        let g = pod(vec![container("a", &[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")])]);
        assert_eq!(qos(&g), Qos::Guaranteed);
        let g_defaulted = pod(vec![container("a", &[], &[("cpu", "1"), ("memory", "1Gi")])]);
        assert_eq!(qos(&g_defaulted), Qos::Guaranteed, "requests default to limits");
        let b = pod(vec![container("a", &[("cpu", "500m"), ("memory", "512Mi")], &[("memory", "1Gi")])]);
        assert_eq!(qos(&b), Qos::Burstable);
        let mixed = pod(vec![
            container("a", &[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")]),
            container("b", &[("cpu", "100m")], &[]),
        ]);
        assert_eq!(qos(&mixed), Qos::Burstable);
        assert_eq!(qos(&pod(vec![container("a", &[], &[])])), Qos::BestEffort);
        let mut told = b.clone();
        told.status = Some(PodStatus { qos_class: Some("Guaranteed".into()), ..Default::default() });
        assert_eq!(qos(&told), Qos::Guaranteed, "the API server's class wins");
    }

    #[test]
    fn a_burstable_pod_shrinks_to_the_floors_and_its_originals_are_kept() {
        let f = Floors::default();
        let p = pod(vec![
            container("app", &[("cpu", "500m"), ("memory", "512Mi")], &[("cpu", "1"), ("memory", "1Gi")]),
            container("side", &[("cpu", "5m"), ("memory", "2Mi")], &[]),
        ]);
        let Shrink::Resize { originals, target, write_annotation } = plan_shrink(&p, &f) else { panic!("{:?}", plan_shrink(&p, &f)) };
        assert!(write_annotation);
        assert_eq!(originals, reqs(json!({"app": {"cpu": "500m", "memory": "512Mi"}})), "below the floors: not touched, not recorded");
        assert_eq!(target, reqs(json!({"app": {"cpu": "10m", "memory": "4Mi"}})));
        assert_eq!(
            resize_patch(&target),
            json!({"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "10m", "memory": "4Mi"}}}]}}),
            "limits are not in the patch"
        );
        assert_eq!(describe(&originals, &target), "app: cpu 500m -> 10m, memory 512Mi -> 4Mi");

        // The annotation round trip: written, then read back by a later pass.
        let annotated_pod = with_annotation(p.clone(), &annotation_value(&originals));
        assert_eq!(annotated(&annotated_pod), Some(Ok(originals.clone())));
        // half-way (annotation written, resize not done): the resize again, the annotation as it is
        assert_eq!(
            plan_shrink(&annotated_pod, &f),
            Shrink::Resize { originals: originals.clone(), target: target.clone(), write_annotation: false }
        );
        // done: nothing more
        let shrunk = resized(annotated_pod, &target);
        assert_eq!(plan_shrink(&shrunk, &f), Shrink::Nothing);
        assert_eq!(released(&originals, &spec_requests(&shrunk)), ((512.0 - 4.0) * 1048576.0, 0.49));
        // an agent with other floors since: the originals still come from the annotation
        let g = Floors::new("20m", "8Mi").unwrap();
        assert_eq!(
            plan_shrink(&shrunk, &g),
            Shrink::Resize {
                originals: originals.clone(),
                target: reqs(json!({"app": {"cpu": "20m", "memory": "8Mi"}})),
                write_annotation: false
            }
        );

        // awake again: the originals back, then the annotation goes
        assert_eq!(plan_grow(&shrunk), Grow::Resize { target: originals.clone() });
        let grown = resized(shrunk, &originals);
        assert_eq!(plan_grow(&grown), Grow::Done);
        assert_eq!(plan_grow(&p), Grow::Nothing);
    }

    #[test]
    fn pods_that_are_left_alone() {
        let f = Floors::default();
        let g = pod(vec![container("app", &[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")])]);
        assert_eq!(plan_shrink(&g, &f), Shrink::LeftAlone(LeftAlone::Guaranteed));
        assert!(LeftAlone::Guaranteed.message().contains("QoS"));
        assert_eq!(plan_shrink(&pod(vec![container("app", &[], &[])]), &f), Shrink::Nothing, "BestEffort: nothing to give back");
        let small = pod(vec![container("app", &[("cpu", "10m"), ("memory", "4Mi")], &[("memory", "1Gi")])]);
        assert_eq!(plan_shrink(&small, &f), Shrink::Nothing, "at the floors already");

        let mut pl = pod(vec![container("app", &[("cpu", "500m")], &[])]);
        pl.spec.as_mut().unwrap().resources = Some(ResourceRequirements { requests: q(&[("memory", "1Gi")]), ..Default::default() });
        assert_eq!(plan_shrink(&pl, &f), Shrink::LeftAlone(LeftAlone::PodLevelResources));

        let mut rp = container("app", &[("cpu", "500m"), ("memory", "512Mi")], &[]);
        rp.resize_policy = Some(vec![ContainerResizePolicy { resource_name: "memory".into(), restart_policy: "RestartContainer".into() }]);
        let Shrink::Resize { target, .. } = plan_shrink(&pod(vec![rp.clone()]), &f) else { panic!() };
        assert_eq!(target, reqs(json!({"app": {"cpu": "10m"}})), "memory would restart the container: CPU only");
        rp.resize_policy
            .as_mut()
            .unwrap()
            .push(ContainerResizePolicy { resource_name: "cpu".into(), restart_policy: "RestartContainer".into() });
        assert_eq!(
            plan_shrink(&pod(vec![rp]), &f),
            Shrink::LeftAlone(LeftAlone::RestartPolicy(vec!["app/cpu".into(), "app/memory".into()]))
        );

        let bad = with_annotation(pod(vec![container("app", &[("cpu", "10m")], &[])]), "{not json");
        assert!(matches!(plan_shrink(&bad, &f), Shrink::LeftAlone(LeftAlone::BadAnnotation(_))));
        assert!(matches!(plan_grow(&bad), Grow::BadAnnotation(_)));
        let odd = with_annotation(pod(vec![container("app", &[("cpu", "10m")], &[])]), r#"{"app":{"gpu":"1"}}"#);
        assert!(matches!(plan_grow(&odd), Grow::BadAnnotation(_)));
    }

    #[test]
    fn growing_never_exceeds_a_limit_or_names_a_gone_container() {
        let p = with_annotation(
            pod(vec![container("app", &[("cpu", "10m"), ("memory", "4Mi")], &[("memory", "256Mi")])]),
            r#"{"app":{"cpu":"500m","memory":"512Mi"},"gone":{"cpu":"1"}}"#,
        );
        assert_eq!(plan_grow(&p), Grow::Resize { target: reqs(json!({"app": {"cpu": "500m", "memory": "256Mi"}})) });
    }

    fn status(conditions: Vec<(&str, &str, &str)>, actual: &[(&str, &str)]) -> PodStatus {
        PodStatus {
            conditions: Some(
                conditions
                    .into_iter()
                    .map(|(t, r, m)| PodCondition {
                        type_: t.into(),
                        status: "True".into(),
                        reason: Some(r.into()),
                        message: Some(m.into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                resources: Some(ResourceRequirements { requests: q(actual), ..Default::default() }),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn pending_resizes_are_read_from_kubelets_conditions() {
        let mut p = pod(vec![container("app", &[("cpu", "500m"), ("memory", "512Mi")], &[("memory", "1Gi")])]);
        p.status = Some(status(
            vec![("PodResizePending", "Deferred", "Node didn't have enough resource: memory")],
            &[("cpu", "10m"), ("memory", "4Mi")],
        ));
        assert_eq!(restore_status(&p), Restore::Pending { reason: "Deferred", message: "Node didn't have enough resource: memory".into() });
        p.status = Some(status(vec![("PodResizePending", "Infeasible", "Node didn't have enough capacity")], &[]));
        assert!(matches!(restore_status(&p), Restore::Pending { reason: "Infeasible", .. }));
        p.status = Some(status(vec![("PodResizeInProgress", "", "")], &[]));
        assert!(matches!(restore_status(&p), Restore::Pending { reason: "InProgress", .. }));
        p.status = Some(status(vec![("PodResizeInProgress", "Error", "UpdateContainerResources failed")], &[]));
        assert!(matches!(restore_status(&p), Restore::Pending { reason: "Error", .. }));
        p.status = Some(status(vec![], &[("cpu", "10m"), ("memory", "4Mi")]));
        assert!(matches!(restore_status(&p), Restore::Pending { reason: "Waiting", .. }), "kubelet has not seen the spec yet");
        p.status = Some(status(vec![], &[("cpu", "0.5"), ("memory", "512Mi")]));
        assert_eq!(restore_status(&p), Restore::Restored);
        p.status = Some(status(vec![("PodResizePending", "Deferred", "x")], &[("cpu", "0.5"), ("memory", "512Mi")]));
        p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert_eq!(restore_status(&p), Restore::Restored, "a False condition is no pending resize");
        assert_eq!(Restore::label("Deferred"), "deferred");
        assert_eq!(Restore::label("Waiting"), "waiting");
    }
}
