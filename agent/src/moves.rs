//! An awake actor that no longer fits its node moves (issue 42 #3): the
//! decision, a pure function of the pod, unit-tested without a cluster.
//!
//! When a woken actor's requests back stay pending (kubelet's
//! `PodResizePending`: `Deferred`, the node has no room now, or
//! `Infeasible`, it never will) for the agent's `move_after`, and its pod
//! says `torpor.dev/on-no-room: move`, the agent suspends the actor (its
//! state is in the store) and deletes the pod. The pod's controller
//! creates it again; the scheduler places it where its original requests
//! fit, and its actor continues there from the snapshot (the removal of a
//! suspended actor's pod uploads it and lets go of the lease, see README
//! "Moving an actor to another node"). Without the annotation, or
//! `stay`, the actor keeps running on its lowered requests.
//!
//! A pod without a controller is never deleted: nothing would create it
//! again, and the actor would only come back with a pod made by hand.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

pub use torpor_api::annotations::ON_NO_ROOM;

/// The values of [`ON_NO_ROOM`], as the Events spell them.
pub const VALUES: &str = "stay, move";

/// What to do for a pod whose actor is awake and whose requests back are
/// pending for `reason` since `pending_for`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing: the pod did not ask for moves, or its resize is not
    /// pending for lack of room.
    Stay,
    /// Asked for, not yet: the resize has been pending for less than
    /// `move_after` (kubelet may still grant it).
    NotYet,
    /// Suspend the actor and delete its pod; `controller` (`Kind/name`)
    /// creates it again.
    Move { controller: String },
    /// Asked for and refused: why (said once in an Event).
    Cannot(String),
}

/// Decides whether the pod's actor moves now.
pub fn plan(pod: &Pod, reason: &str, pending_for: Duration, move_after: Duration) -> Plan {
    match pod.annotations().get(ON_NO_ROOM).map(String::as_str) {
        None | Some("stay") => return Plan::Stay,
        Some("move") => {}
        Some(other) => return Plan::Cannot(format!("{ON_NO_ROOM}={other:?} is not one of {VALUES}: it stays")),
    }
    if !matches!(reason, "Deferred" | "Infeasible") {
        return Plan::Stay;
    }
    if pending_for < move_after {
        return Plan::NotYet;
    }
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    match owner {
        Some(o) => Plan::Move { controller: format!("{}/{}", o.kind, o.name) },
        None => Plan::Cannot(format!(
            "{ON_NO_ROOM}=move: the pod has no controller (a StatefulSet, a ReplicaSet...) to create it again on another node: it stays"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(policy: Option<&str>, owner: Option<(&str, bool)>) -> Pod {
        let mut p = Pod::default();
        p.metadata.annotations = policy.map(|v| [(ON_NO_ROOM.to_string(), v.to_string())].into());
        p.metadata.owner_references = owner.map(|(kind, controller)| {
            vec![OwnerReference { kind: kind.into(), name: "web".into(), controller: Some(controller), ..Default::default() }]
        });
        p
    }

    const AFTER: Duration = Duration::from_secs(10);
    const LONG: Duration = Duration::from_secs(11);

    #[test]
    fn only_an_opted_in_pod_with_no_room_and_a_controller_moves() {
        let sts = Some(("StatefulSet", true));
        assert_eq!(plan(&pod(Some("move"), sts), "Deferred", LONG, AFTER), Plan::Move { controller: "StatefulSet/web".into() });
        assert_eq!(plan(&pod(Some("move"), sts), "Infeasible", LONG, AFTER), Plan::Move { controller: "StatefulSet/web".into() });
        assert_eq!(plan(&pod(Some("move"), sts), "Deferred", Duration::from_secs(3), AFTER), Plan::NotYet, "kubelet may still grant it");
        assert_eq!(plan(&pod(None, sts), "Deferred", LONG, AFTER), Plan::Stay, "the default stays");
        assert_eq!(plan(&pod(Some("stay"), sts), "Deferred", LONG, AFTER), Plan::Stay);
        for reason in ["InProgress", "Error", "Waiting"] {
            assert_eq!(plan(&pod(Some("move"), sts), reason, LONG, AFTER), Plan::Stay, "{reason}: not a lack of room");
        }
    }

    #[test]
    fn a_pod_nobody_would_create_again_is_not_deleted() {
        for owner in [None, Some(("StatefulSet", false))] {
            match plan(&pod(Some("move"), owner), "Deferred", LONG, AFTER) {
                Plan::Cannot(why) => assert!(why.contains("no controller"), "{why}"),
                other => panic!("{owner:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_bad_value_is_named() {
        match plan(&pod(Some("Move"), Some(("StatefulSet", true))), "Deferred", LONG, AFTER) {
            Plan::Cannot(why) => assert!(why.contains("\"Move\"") && why.contains(VALUES), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
