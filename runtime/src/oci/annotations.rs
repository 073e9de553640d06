//! `torpor.dev/*` annotations, validated into an [`ActorSpec`].
//!
//! Every annotation is optional. A value that does not parse is an error that
//! names the annotation and the allowed form: torpor never falls back to a
//! default silently. An unknown `torpor.dev/` key is an error too, so that a
//! typo (`torpor.dev/idle-afer`) does not go unnoticed; the annotations
//! torpor's own agent and kubectl plugin write on a pod
//! ([`torpor_api::annotations::AGENT_KEYS`]) are passed over.
//!
//! Tenancy (docs/SECURITY.md, "Pod authors"): under Kubernetes an actor
//! belongs to its pod's namespace (CRI's sandbox metadata, which no pod
//! author sets). `torpor.dev/actor` names an actor within it (`web` is
//! `<namespace>/web`; another namespace is refused), and so does a bare
//! `torpor.dev/restore-from`; a restore source of another namespace is
//! allowed only where the node's policy lists that namespace
//! ([`ActorSpec::foreign_clone_source`], checked at create).

use std::collections::HashMap;
use std::time::Duration;

use torpor_api::annotations::AGENT_KEYS;
use torpor_api::ids::{ActorId, SnapshotSelector};

use crate::error::{Error, Result};

/// Prefix of every torpor annotation.
pub const PREFIX: &str = "torpor.dev/";
pub const ACTOR: &str = "torpor.dev/actor";
pub const IDLE_AFTER: &str = "torpor.dev/idle-after";
pub const FREEZE_FIRST: &str = "torpor.dev/freeze-first";
pub const KEEP_LOCAL: &str = "torpor.dev/keep-local";
pub const ACTIVATE_ON: &str = "torpor.dev/activate-on";
pub const RESTORE_FROM: &str = "torpor.dev/restore-from";
pub use torpor_api::annotations::ON_STOP;
pub const ON_RESTORE_FAILURE: &str = "torpor.dev/on-restore-failure";

const KNOWN: [&str; 8] = [ACTOR, IDLE_AFTER, FREEZE_FIRST, KEEP_LOCAL, ACTIVATE_ON, RESTORE_FROM, ON_STOP, ON_RESTORE_FAILURE];

/// The longest duration an annotation may give: 100 years. Anything longer
/// is a mistake, and would overflow the millisecond and clock arithmetic
/// the runtime does with it.
pub const MAX_DURATION: Duration = Duration::from_secs(876_000 * 3600);

const DURATION_FORM: &str = "a duration such as 500ms, 30s, 5m or 1h (a whole number followed by ms, s, m or h)";
const ACTOR_FORM: &str = "1 to 253 characters of a-z, 0-9, '-', '.', '_' and at most one '/', \
     each part starting and ending with a letter or digit, no \"..\" (e.g. default/my-pod)";
const PORTS_FORM: &str = "a comma-separated list of TCP ports from 1 to 65535, digits only, no leading zero (e.g. 8080,9090)";
const RESTORE_FROM_FORM: &str = "<actor> (its newest snapshot) or <actor>@<generation> (a whole number \
     from 1), where <actor> is 1 to 253 characters of a-z, 0-9, '-', '.', '_' and at most one '/', \
     starting and ending with a letter or digit (e.g. golden/base or golden/base@3)";

// Kubernetes annotations the CRI plugin sets, used for the default actor id.
pub const K8S_POD_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const K8S_POD_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const K8S_POD_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// What a failed restore leaves (`torpor.dev/on-restore-failure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnRestoreFailure {
    /// `keep` (the default): the actor stays SUSPENDED, its snapshot kept,
    /// still listening, the error visible; a later trigger retries.
    #[default]
    Keep,
    /// `cold-start`: the containers start afresh from their image; the
    /// snapshot is kept in the store, not restored.
    ColdStart,
}

/// The validated torpor configuration of one actor (a pod's app containers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorSpec {
    /// Actor id: `torpor.dev/actor` (under CRI, within the pod's
    /// namespace: `<namespace>/<name>`), or `<namespace>/<pod name>`.
    pub actor: Option<String>,
    /// The pod's namespace (CRI's `io.kubernetes.cri.sandbox-namespace`),
    /// which the actor and any restore source of its own belong to; `None`
    /// outside Kubernetes (a `ctr` container: node operators only).
    pub namespace: Option<String>,
    /// The pod's uid (CRI's `io.kubernetes.cri.sandbox-uid`).
    pub pod_uid: Option<String>,
    pub idle_after: Option<Duration>,
    /// `torpor.dev/freeze-first`: a suspend freezes the actor in memory
    /// for this long before the checkpoint (the freeze tier,
    /// [`crate::lifecycle::freeze`]).
    pub freeze_first: Option<Duration>,
    pub keep_local: Option<Duration>,
    pub activate_on: Option<Vec<u16>>,
    /// `torpor.dev/restore-from`: the snapshot a new actor is cloned from.
    pub restore_from: Option<RestoreSource>,
    /// `torpor.dev/on-stop: suspend`: a stop (SIGTERM: kubelet's
    /// StopContainer, a drain) suspends the actor before its containers
    /// exit, so the next pod of the actor, on any node, continues it.
    pub suspend_on_stop: bool,
    /// `torpor.dev/on-restore-failure`: keep (default) or cold-start.
    pub on_restore_failure: OnRestoreFailure,
}

/// The snapshot named by `torpor.dev/restore-from`: an actor's newest, or
/// one generation of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSource {
    pub actor: String,
    pub generation: Option<u64>,
}

impl std::fmt::Display for RestoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.generation {
            Some(g) => write!(f, "{}@{g}", self.actor),
            None => f.write_str(&self.actor),
        }
    }
}

impl ActorSpec {
    /// Validates the annotations of an OCI spec (containerd copies the allowed
    /// pod annotations into every container's spec).
    pub fn from_annotations(annotations: &HashMap<String, String>) -> Result<Self> {
        let mut spec = ActorSpec {
            namespace: annotations.get(K8S_POD_NAMESPACE).cloned(),
            pod_uid: annotations.get(K8S_POD_UID).cloned(),
            ..ActorSpec::default()
        };
        let ns = spec.namespace.clone();
        let mut keys: Vec<&String> = annotations.keys().filter(|k| k.starts_with(PREFIX)).collect();
        keys.sort();
        for key in keys {
            let value = annotations[key].as_str();
            match key.as_str() {
                ACTOR => spec.actor = Some(in_namespace(key, value, ns.as_deref(), parse_actor_id(key, value)?, false)?),
                IDLE_AFTER => spec.idle_after = Some(parse_duration(key, value)?),
                FREEZE_FIRST => spec.freeze_first = Some(parse_duration(key, value)?),
                KEEP_LOCAL => spec.keep_local = Some(parse_duration(key, value)?),
                ACTIVATE_ON => spec.activate_on = Some(parse_ports(key, value)?),
                RESTORE_FROM => {
                    let mut src = parse_restore_from(key, value)?;
                    src.actor = in_namespace(key, value, ns.as_deref(), src.actor, true)?;
                    spec.restore_from = Some(src);
                }
                ON_STOP => {
                    spec.suspend_on_stop = match value {
                        "suspend" => true,
                        "stop" => false,
                        _ => {
                            return Err(invalid(
                                key,
                                value,
                                "expected suspend (checkpoint the actor before it stops) or stop (the default)",
                            ))
                        }
                    }
                }
                ON_RESTORE_FAILURE => {
                    spec.on_restore_failure = match value {
                        "keep" => OnRestoreFailure::Keep,
                        "cold-start" => OnRestoreFailure::ColdStart,
                        _ => {
                            return Err(invalid(
                                key,
                                value,
                                "expected keep (stay suspended, snapshot kept, error visible: the default) \
                             or cold-start (start the containers afresh from their image)",
                            ))
                        }
                    }
                }
                k if AGENT_KEYS.contains(&k) => {}
                _ => {
                    return Err(invalid(
                        key,
                        value,
                        &format!(
                            "unknown torpor annotation; known ones are {} (and {}, written by torpor's agent and kubectl plugin)",
                            KNOWN.join(", "),
                            AGENT_KEYS.join(", ")
                        ),
                    ))
                }
            }
        }
        if spec.actor.is_none() {
            if let (Some(ns), Some(name)) = (annotations.get(K8S_POD_NAMESPACE), annotations.get(K8S_POD_NAME)) {
                let id = format!("{ns}/{name}");
                // The user never set torpor.dev/actor: name what the id came from.
                let key = format!("{K8S_POD_NAMESPACE}/{K8S_POD_NAME}");
                spec.actor = Some(parse_actor_id(&key, &id).map_err(|_| {
                    invalid(
                        &key,
                        &id,
                        &format!(
                            "the default actor id, <pod namespace>/<pod name>, is not {ACTOR_FORM}; \
                         set {ACTOR} to name the actor"
                        ),
                    )
                })?);
            }
        }
        Ok(spec)
    }

    /// The namespace of the restore source when it is not the pod's own:
    /// a clone across tenants, which the node's policy must allow.
    pub fn foreign_clone_source(&self) -> Option<&str> {
        let ns = self.namespace.as_deref()?;
        let src = self.restore_from.as_ref()?;
        let src_ns = src.actor.split_once('/').map(|(n, _)| n).unwrap_or("");
        (src_ns != ns).then_some(src_ns)
    }
}

/// Actor id `id` (as given in `key = value`) within the pod's namespace
/// `ns`: a bare name is qualified (`web` → `<ns>/web`); an id of another
/// namespace is refused for `torpor.dev/actor` and kept for a restore
/// source (`foreign_ok`), whose namespace the node's policy decides on.
/// Outside Kubernetes (`ns` unknown) ids are taken as given.
fn in_namespace(key: &str, value: &str, ns: Option<&str>, id: String, foreign_ok: bool) -> Result<String> {
    let Some(ns) = ns else { return Ok(id) };
    match id.split_once('/') {
        None => parse_actor_id(key, &format!("{ns}/{id}")).map_err(|_| {
            invalid(
                key,
                value,
                &format!("{ns}/{id} (the name within the pod's namespace {ns}) is longer than an actor id may be (253 characters)"),
            )
        }),
        Some((own, _)) if own == ns || foreign_ok => Ok(id),
        Some(_) => Err(invalid(key, value, &format!("a pod's actor belongs to the pod's namespace {ns}: name it <name> or {ns}/<name>"))),
    }
}

fn invalid(key: &str, value: &str, reason: &str) -> Error {
    Error::InvalidAnnotation { key: key.to_string(), value: value.to_string(), reason: reason.to_string() }
}

/// Parses `500ms`, `30s`, `5m`, `1h`. Zero is refused: "off" is expressed by
/// leaving the annotation out.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let reason = format!("expected {DURATION_FORM}");
    let per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(invalid(key, value, &reason)),
    };
    if num.is_empty() {
        return Err(invalid(key, value, &reason));
    }
    let too_long = || invalid(key, value, "too long: at most 876000h (100 years)");
    // All digits: a parse failure is an overflow.
    let n: u64 = num.parse().map_err(|_| too_long())?;
    let ms = n.checked_mul(per_unit).ok_or_else(too_long)?;
    let d = Duration::from_millis(ms);
    if d > MAX_DURATION {
        return Err(too_long());
    }
    if d.is_zero() {
        return Err(invalid(key, value, "must be greater than zero (leave the annotation out to disable)"));
    }
    Ok(d)
}

/// Actor ids become file and object names, so they are restricted to a
/// charset that can never form a path component like `..`.
pub fn parse_actor_id(key: &str, value: &str) -> Result<String> {
    ActorId::parse(value).map(ActorId::into_string).map_err(|e| invalid(key, value, &format!("{}; expected {ACTOR_FORM}", e.problem)))
}

/// Parses `<actor>` or `<actor>@<generation>` (generation from 1, digits
/// only), with the rules of [`torpor_api::ids`] (shared with the store and
/// torporctl).
pub fn parse_restore_from(key: &str, value: &str) -> Result<RestoreSource> {
    let s = SnapshotSelector::parse(value).map_err(|e| invalid(key, value, &format!("{}; expected {RESTORE_FROM_FORM}", e.problem)))?;
    Ok(RestoreSource { actor: s.actor.into_string(), generation: s.generation })
}

fn parse_ports(key: &str, value: &str) -> Result<Vec<u16>> {
    let reason = format!("expected {PORTS_FORM}");
    let mut ports = Vec::new();
    for p in value.split(',') {
        let p = p.trim();
        // Digits only (u16's parser takes a '+'), no leading zero.
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.starts_with('0') {
            return Err(invalid(key, value, &reason));
        }
        let port: u16 = p.parse().map_err(|_| invalid(key, value, &reason))?;
        ports.push(port);
    }
    Ok(ports)
}

/// Fuzzing entry (`fuzz/fuzz_targets/fuzz_annotations.rs`, and the corpus
/// replay in the tests): `data` as `key=value` lines. Whatever it holds,
/// parsing never panics, and what it accepts keeps the bounds.
#[doc(hidden)]
pub fn fuzz_parse(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let map: HashMap<String, String> =
        text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    if let Ok(spec) = ActorSpec::from_annotations(&map) {
        for d in [spec.idle_after, spec.freeze_first, spec.keep_local].into_iter().flatten() {
            assert!(!d.is_zero() && d <= MAX_DURATION, "{d:?} accepted");
        }
        if let Some(a) = &spec.actor {
            assert!(a.len() <= 253 && a.split('/').all(|p| !p.is_empty() && p != "." && p != ".."), "actor {a:?} accepted");
        }
        if let Some(p) = &spec.activate_on {
            assert!(!p.is_empty() && !p.contains(&0), "ports {p:?} accepted");
        }
        if let Some(r) = &spec.restore_from {
            assert!(r.generation != Some(0), "{r} accepted");
        }
    }
    for line in text.lines() {
        if let Ok(d) = parse_duration(IDLE_AFTER, line) {
            assert!(!d.is_zero() && d <= MAX_DURATION, "{line:?} gave {d:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn actor_ids_follow_the_one_parser_of_torpor_api() {
        for bad in ["a..b", "ns/a..b", "a/b/c", "-a", "a.", "A", ""] {
            let e = ActorSpec::from_annotations(&ann(&[(ACTOR, bad)])).unwrap_err().to_string();
            assert!(e.contains(ACTOR) && e.contains("expected"), "{bad:?}: {e}");
        }
        assert!(ActorSpec::from_annotations(&ann(&[(RESTORE_FROM, "golden/a..b@2")])).is_err());
        assert!(ActorSpec::from_annotations(&ann(&[(RESTORE_FROM, "golden/base@02")])).is_err());
        let s = ActorSpec::from_annotations(&ann(&[(ACTOR, "ns/a.b"), (RESTORE_FROM, "golden/base@3")])).unwrap();
        assert_eq!(s.actor.as_deref(), Some("ns/a.b"));
        assert_eq!(s.restore_from, Some(RestoreSource { actor: "golden/base".into(), generation: Some(3) }));
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(ActorSpec::from_annotations(&ann(&[])).unwrap(), ActorSpec::default());
    }

    #[test]
    fn parses_all_fields() {
        let s = ActorSpec::from_annotations(&ann(&[
            (ACTOR, "team-a/notebook.1"),
            (IDLE_AFTER, "30s"),
            (FREEZE_FIRST, "500ms"),
            (KEEP_LOCAL, "5m"),
            (ACTIVATE_ON, "8080, 9090"),
            (RESTORE_FROM, "golden"),
            ("other.io/x", "ignored"),
        ]))
        .unwrap();
        assert_eq!(s.actor.as_deref(), Some("team-a/notebook.1"));
        assert_eq!(s.idle_after, Some(Duration::from_secs(30)));
        assert_eq!(s.freeze_first, Some(Duration::from_millis(500)));
        assert_eq!(s.keep_local, Some(Duration::from_secs(300)));
        assert_eq!(s.activate_on, Some(vec![8080, 9090]));
        assert_eq!(s.restore_from, Some(RestoreSource { actor: "golden".into(), generation: None }));
    }

    #[test]
    fn default_actor_from_cri_pod() {
        let s = ActorSpec::from_annotations(&ann(&[(K8S_POD_NAMESPACE, "default"), (K8S_POD_NAME, "web-0")])).unwrap();
        assert_eq!(s.actor.as_deref(), Some("default/web-0"));
    }

    #[test]
    fn bad_duration_names_key_and_form() {
        for bad in ["banana", "", "10", "5d", "-1s", "0s", "1.5s"] {
            let e = ActorSpec::from_annotations(&ann(&[(IDLE_AFTER, bad)])).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(IDLE_AFTER), "{msg}");
            assert!(msg.contains("duration") || msg.contains("greater than zero"), "{msg}");
        }
    }

    #[test]
    fn actor_ids_cannot_be_paths() {
        for bad in ["..", "../etc", "a/../b", "/abs", "a/b/c", "UPPER", "a b", "-a", "a/", ""] {
            assert!(parse_actor_id(ACTOR, bad).is_err(), "{bad} accepted");
        }
        for good in ["a", "default/pod-1", "x.y_z", "0"] {
            assert!(parse_actor_id(ACTOR, good).is_ok(), "{good} refused");
        }
    }

    #[test]
    fn restore_from_actor_or_generation() {
        let r = parse_restore_from(RESTORE_FROM, "golden/base@12").unwrap();
        assert_eq!(r, RestoreSource { actor: "golden/base".into(), generation: Some(12) });
        assert_eq!(r.to_string(), "golden/base@12");
        assert_eq!(parse_restore_from(RESTORE_FROM, "golden").unwrap().to_string(), "golden");
        for bad in [
            "",
            "@3",
            "golden@",
            "golden@0",
            "golden@-1",
            "golden@+3",
            "golden@3x",
            "golden@1@2",
            "golden@99999999999999999999",
            "Golden",
            "../x@1",
            "a/b/c@1",
            "golden @1",
        ] {
            let e = ActorSpec::from_annotations(&ann(&[(RESTORE_FROM, bad)])).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(RESTORE_FROM) && msg.contains(&format!("{bad:?}")) && msg.contains("<actor>@<generation>"),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn on_stop_is_suspend_or_stop() {
        assert!(ActorSpec::from_annotations(&ann(&[(ON_STOP, "suspend")])).unwrap().suspend_on_stop);
        assert!(!ActorSpec::from_annotations(&ann(&[(ON_STOP, "stop")])).unwrap().suspend_on_stop);
        assert!(!ActorSpec::from_annotations(&ann(&[])).unwrap().suspend_on_stop);
        for bad in ["", "Suspend", "checkpoint", "suspend "] {
            let msg = ActorSpec::from_annotations(&ann(&[(ON_STOP, bad)])).unwrap_err().to_string();
            assert!(msg.contains(ON_STOP) && msg.contains("expected suspend"), "{bad:?}: {msg}");
        }
    }

    #[test]
    fn huge_durations_are_refused_not_wrapped() {
        // 18446744073709552 s is u64::MAX ms rounded up: as_millis() as u64
        // once wrapped it to about 384 ms.
        for bad in ["18446744073709552s", "18446744073709551616ms", "5124095576030431h", "99999999999999999999h", "876001h", "52560001m"] {
            let msg = ActorSpec::from_annotations(&ann(&[(KEEP_LOCAL, bad)])).unwrap_err().to_string();
            assert!(msg.contains(KEEP_LOCAL) && msg.contains("too long"), "{bad}: {msg}");
        }
        assert_eq!(parse_duration(KEEP_LOCAL, "876000h").unwrap(), MAX_DURATION);
        assert_eq!(parse_duration(KEEP_LOCAL, "18446744073709551615ms").ok(), None);
        assert_eq!(parse_duration(KEEP_LOCAL, "90m").unwrap(), Duration::from_secs(5400));
    }

    #[test]
    fn a_long_default_actor_id_names_the_pod_annotations() {
        let long = "a".repeat(250);
        let e = ActorSpec::from_annotations(&ann(&[(K8S_POD_NAMESPACE, "default"), (K8S_POD_NAME, &long)])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(K8S_POD_NAMESPACE) && msg.contains(K8S_POD_NAME), "{msg}");
        assert!(msg.contains("set torpor.dev/actor"), "{msg}");
        assert!(!msg.starts_with(&format!("invalid annotation {ACTOR}=")), "{msg}");
        // With torpor.dev/actor set, the pod's name does not matter.
        let s = ActorSpec::from_annotations(&ann(&[(K8S_POD_NAMESPACE, "default"), (K8S_POD_NAME, &long), (ACTOR, "short")])).unwrap();
        assert_eq!(s.actor.as_deref(), Some("default/short"), "within the pod's namespace");
    }

    #[test]
    fn on_restore_failure_is_keep_or_cold_start() {
        assert_eq!(ActorSpec::from_annotations(&ann(&[])).unwrap().on_restore_failure, OnRestoreFailure::Keep);
        assert_eq!(ActorSpec::from_annotations(&ann(&[(ON_RESTORE_FAILURE, "keep")])).unwrap().on_restore_failure, OnRestoreFailure::Keep);
        assert_eq!(
            ActorSpec::from_annotations(&ann(&[(ON_RESTORE_FAILURE, "cold-start")])).unwrap().on_restore_failure,
            OnRestoreFailure::ColdStart
        );
        for bad in ["", "Keep", "coldstart", "cold-start ", "restart"] {
            let msg = ActorSpec::from_annotations(&ann(&[(ON_RESTORE_FAILURE, bad)])).unwrap_err().to_string();
            assert!(msg.contains(ON_RESTORE_FAILURE) && msg.contains("expected keep"), "{bad:?}: {msg}");
        }
    }

    #[test]
    fn bad_ports_and_unknown_keys() {
        for bad in ["0", "70000", "+8080", "08080", "-1", "8080,", "", "8080,,9090", "0x50", "80 80"] {
            let msg = ActorSpec::from_annotations(&ann(&[(ACTIVATE_ON, bad)])).unwrap_err().to_string();
            assert!(msg.contains(ACTIVATE_ON) && msg.contains("TCP ports"), "{bad:?}: {msg}");
        }
        assert_eq!(parse_ports(ACTIVATE_ON, "1,65535, 80").unwrap(), vec![1, 65535, 80]);
        let e = ActorSpec::from_annotations(&ann(&[("torpor.dev/idle-afer", "5s")])).unwrap_err();
        assert!(e.to_string().contains("unknown torpor annotation"));
    }

    /// A container that kubelet creates again after the agent acted on its
    /// pod carries the agent's annotations: they are passed over, not
    /// refused (issue 37, item 3).
    #[test]
    fn the_agents_own_annotations_are_passed_over() {
        let s = ActorSpec::from_annotations(&ann(&[
            (K8S_POD_NAMESPACE, "team-a"),
            (K8S_POD_NAME, "web-0"),
            ("torpor.dev/desired-state", "suspended"),
            ("torpor.dev/applied-state", "suspended"),
            ("torpor.dev/applied-result", "ok: suspend in 1032 ms"),
            ("torpor.dev/snapshot", "team-a/web-0@3"),
            ("torpor.dev/moved-from", "node-a (SUSPENDED)"),
            ("torpor.dev/requests", r#"{"app":{"cpu":"500m","memory":"512Mi"}}"#),
            (IDLE_AFTER, "5m"),
        ]))
        .unwrap();
        assert_eq!(s.actor.as_deref(), Some("team-a/web-0"));
        assert_eq!(s.idle_after, Some(Duration::from_secs(300)));
        let e = ActorSpec::from_annotations(&ann(&[("torpor.dev/applied-stat", "x")])).unwrap_err().to_string();
        assert!(e.contains("unknown torpor annotation") && e.contains("torpor.dev/applied-state"), "{e}");
    }

    /// An actor belongs to its pod's namespace (issue 38, row 1).
    #[test]
    fn actor_ids_are_bound_to_the_pods_namespace() {
        let in_ns = |pairs: &[(&str, &str)]| {
            let mut a = ann(pairs);
            a.insert(K8S_POD_NAMESPACE.into(), "team-a".into());
            a.insert(K8S_POD_NAME.into(), "web-0".into());
            ActorSpec::from_annotations(&a)
        };
        let s = in_ns(&[(ACTOR, "web")]).unwrap();
        assert_eq!(s.actor.as_deref(), Some("team-a/web"), "a bare name is within the pod's namespace");
        assert_eq!(s.namespace.as_deref(), Some("team-a"));
        assert_eq!(in_ns(&[(ACTOR, "team-a/web")]).unwrap().actor.as_deref(), Some("team-a/web"));
        let e = in_ns(&[(ACTOR, "team-b/web")]).unwrap_err().to_string();
        assert!(e.contains(ACTOR) && e.contains("belongs to the pod's namespace team-a"), "{e}");
        assert!(!e.contains("web-0"), "nothing but what the pod gave and its own namespace: {e}");
        let e = in_ns(&[(ACTOR, &"x".repeat(250))]).unwrap_err().to_string();
        assert!(e.contains("longer than an actor id may be"), "{e}");

        // Restore sources: a bare one and one of the own namespace are the
        // pod's own; another namespace's is kept for the node's policy.
        let s = in_ns(&[(RESTORE_FROM, "base@2")]).unwrap();
        assert_eq!(s.restore_from, Some(RestoreSource { actor: "team-a/base".into(), generation: Some(2) }));
        assert_eq!(s.foreign_clone_source(), None);
        assert_eq!(in_ns(&[(RESTORE_FROM, "team-a/base")]).unwrap().foreign_clone_source(), None);
        let s = in_ns(&[(RESTORE_FROM, "golden/base")]).unwrap();
        assert_eq!(s.foreign_clone_source(), Some("golden"));
        assert_eq!(s.restore_from.unwrap().actor, "golden/base");

        // Outside Kubernetes (ctr): ids as given.
        let s = ActorSpec::from_annotations(&ann(&[(ACTOR, "web"), (RESTORE_FROM, "golden/base")])).unwrap();
        assert_eq!(s.actor.as_deref(), Some("web"));
        assert_eq!(s.foreign_clone_source(), None);
    }

    /// The committed fuzz corpus (and any crasher kept there) replayed.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fuzz_annotations");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            fuzz_parse(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no corpus in {dir:?}");
    }
}
