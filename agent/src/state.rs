//! The names the agent and the plugin agree on, and the decision of what
//! to do for a pod: pure functions, unit-tested.

use torporctl::control::Op;

pub use torpor_api::annotations::{APPLIED, DESIRED, MOVED_FROM, RESULT, SNAPSHOT};
/// The actor id of a pod, when set (else `<namespace>/<pod>`).
pub const ACTOR: &str = "torpor.dev/actor";
/// The pod label with the actor's state (`kubectl get pods -L torpor.dev/state`).
pub const STATE_LABEL: &str = "torpor.dev/state";
/// The pod condition: True while the actor is suspended.
pub const CONDITION: &str = "torpor.dev/Suspended";
/// The RuntimeClass whose pods the agent looks after.
pub const RUNTIME_CLASS: &str = "torpor";
/// The agent's name as a field manager and event reporter.
pub const MANAGER: &str = "torpor-agent";

/// A state a pod can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Desired {
    Running,
    Suspended,
    Frozen,
}

impl Desired {
    /// The annotation's values, as the plugin and the Events spell them.
    pub const VALUES: &'static str = "running, suspended, frozen";

    pub fn parse(v: &str) -> Result<Desired, String> {
        match v {
            "running" => Ok(Desired::Running),
            "suspended" => Ok(Desired::Suspended),
            "frozen" => Ok(Desired::Frozen),
            other => Err(format!("{DESIRED}={other:?} is not one of {}", Desired::VALUES)),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Desired::Running => "running",
            Desired::Suspended => "suspended",
            Desired::Frozen => "frozen",
        }
    }

    /// The actor state that satisfies it (as the shim names it).
    pub fn actor_state(self) -> &'static str {
        match self {
            Desired::Running => "RUNNING",
            Desired::Suspended => "SUSPENDED",
            Desired::Frozen => "FROZEN",
        }
    }
}

/// What to do for a pod whose annotation asks `desired` while its actor is in `current`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The actor is in the state asked for.
    Done,
    /// Run this operation (then plan again).
    Run(Op),
    /// The actor is between states (suspending, resuming): look again later.
    Wait,
}

pub fn plan(desired: Desired, current: &str) -> Plan {
    match (desired, current) {
        (d, c) if d.actor_state() == c => Plan::Done,
        (_, s) if is_transient(s) => Plan::Wait,
        (Desired::Running, "SUSPENDED" | "FROZEN") => Plan::Run(Op::Resume),
        (Desired::Suspended, "RUNNING" | "FROZEN") => Plan::Run(Op::Suspend),
        (Desired::Frozen, "RUNNING") => Plan::Run(Op::Freeze),
        // a suspended actor is restored first, then frozen
        (Desired::Frozen, "SUSPENDED") => Plan::Run(Op::Resume),
        _ => Plan::Wait,
    }
}

/// The label value of an actor state (`SUSPENDED` -> `suspended`; a state
/// this build does not know, `UNKNOWN(42)`, -> `unknown`).
pub fn label_value(actor_state: &str) -> String {
    if actor_state.is_empty() || !actor_state.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') {
        return "unknown".into();
    }
    actor_state.to_ascii_lowercase()
}

/// A state the actor passes through (SUSPENDING, RESUMING), not one it
/// settles in.
pub fn is_transient(actor_state: &str) -> bool {
    matches!(actor_state, "SUSPENDING" | "RESUMING")
}

/// The Event reasons of an operation: (on success, on failure). `from` is
/// the state it started in (a resume of a suspended actor is a restore).
pub fn event_reasons(op: Op, from: &str) -> (&'static str, &'static str) {
    match op {
        Op::Suspend => ("Suspended", "SuspendFailed"),
        Op::Resume if from == "SUSPENDED" => ("Resumed", "RestoreFailed"),
        Op::Resume => ("Thawed", "ThawFailed"),
        Op::Freeze => ("Frozen", "FreezeFailed"),
    }
}

/// The node an actor moved here from, with its state, when that is not
/// reported on the pod yet (`reported`: its [`MOVED_FROM`] annotation):
/// its lease came from another node (`moved_from`) and it was restored
/// from a snapshot by identity (`recovered_from`), not started cold, and
/// that restore is over (`state` is not RESUMING: a failed one clears
/// `recovered_from`).
pub fn moved_from<'a>(state: &str, moved_from: Option<&'a str>, recovered_from: Option<&str>, reported: Option<&str>) -> Option<&'a str> {
    let from = moved_from.filter(|n| !n.is_empty() && state != "RESUMING")?;
    recovered_from?;
    (reported != Some(from)).then_some(from)
}

/// Event reason of an unknown [`DESIRED`] value.
pub const INVALID_DESIRED: &str = "InvalidDesiredState";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_values() {
        for d in [Desired::Running, Desired::Suspended, Desired::Frozen] {
            assert_eq!(Desired::parse(d.as_str()), Ok(d));
        }
        let e = Desired::parse("asleep").unwrap_err();
        assert!(e.contains("\"asleep\"") && e.contains(DESIRED) && e.contains("suspended"), "{e}");
        assert!(Desired::parse("Suspended").is_err(), "values are lower case");
        assert!(Desired::parse("").is_err());
    }

    #[test]
    fn plans() {
        assert_eq!(plan(Desired::Suspended, "RUNNING"), Plan::Run(Op::Suspend));
        assert_eq!(plan(Desired::Suspended, "FROZEN"), Plan::Run(Op::Suspend));
        assert_eq!(plan(Desired::Suspended, "SUSPENDED"), Plan::Done);
        assert_eq!(plan(Desired::Suspended, "SUSPENDING"), Plan::Wait);
        assert!(is_transient("SUSPENDING") && is_transient("RESUMING"));
        assert!(!is_transient("RUNNING") && !is_transient("SUSPENDED") && !is_transient("FROZEN"));
        assert_eq!(plan(Desired::Running, "SUSPENDED"), Plan::Run(Op::Resume));
        assert_eq!(plan(Desired::Running, "FROZEN"), Plan::Run(Op::Resume));
        assert_eq!(plan(Desired::Running, "RUNNING"), Plan::Done);
        assert_eq!(plan(Desired::Running, "RESUMING"), Plan::Wait);
        assert_eq!(plan(Desired::Frozen, "RUNNING"), Plan::Run(Op::Freeze));
        assert_eq!(plan(Desired::Frozen, "SUSPENDED"), Plan::Run(Op::Resume));
        assert_eq!(plan(Desired::Frozen, "FROZEN"), Plan::Done);
        assert_eq!(plan(Desired::Running, "UNKNOWN(42)"), Plan::Wait);
    }

    #[test]
    fn a_move_is_reported_once_and_only_with_its_state() {
        let r = "RUNNING";
        assert_eq!(moved_from(r, Some("node-a"), Some("ns/x@3"), None), Some("node-a"));
        assert_eq!(moved_from("SUSPENDED", Some("node-a"), Some("ns/x@3"), None), Some("node-a"), "and suspended since");
        assert_eq!(moved_from("RESUMING", Some("node-a"), Some("ns/x@3"), None), None, "its restore is not over yet");
        assert_eq!(moved_from(r, Some("node-a"), Some("ns/x@3"), Some("node-a")), None, "reported already");
        assert_eq!(moved_from(r, Some("node-b"), Some("ns/x@5"), Some("node-a")), Some("node-b"), "moved again");
        assert_eq!(moved_from(r, Some("node-a"), None, None), None, "started cold: nothing came with it");
        assert_eq!(moved_from(r, None, Some("ns/x@3"), None), None, "restored on the node it ran on");
        assert_eq!(moved_from(r, Some(""), Some("ns/x@3"), None), None);
    }

    #[test]
    fn labels_and_reasons() {
        assert_eq!(label_value("SUSPENDED"), "suspended");
        assert_eq!(label_value("UNKNOWN(42)"), "unknown");
        assert_eq!(label_value(""), "unknown");
        assert_eq!(event_reasons(Op::Resume, "SUSPENDED"), ("Resumed", "RestoreFailed"));
        assert_eq!(event_reasons(Op::Resume, "FROZEN"), ("Thawed", "ThawFailed"));
        assert_eq!(event_reasons(Op::Suspend, "RUNNING"), ("Suspended", "SuspendFailed"));
    }
}
