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
//! again, and the actor would only come back with a pod made by hand. Nor
//! is a pod a PodDisruptionBudget protects while the budget allows no
//! disruption ([`budget_refusal`]): the agent deletes the pod (the Eviction
//! API would let the agent's admission policy no longer see which node the
//! pod is on), so it applies the budget as `kubectl drain` would.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
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

/// Why the pod must not be deleted now for the PodDisruptionBudgets of its
/// namespace (`budgets`), or None. A budget selects the pod by its
/// selector (policy/v1: an empty selector selects every pod of the
/// namespace, none selects none); it allows the move while its status
/// allows at least one disruption. A budget the disruption controller has
/// not yet computed, or whose selector cannot be read, refuses: a move is
/// never worth a disruption the owner ruled out.
pub fn budget_refusal(pod: &Pod, budgets: &[PodDisruptionBudget]) -> Option<String> {
    let labels = pod.labels();
    for b in budgets {
        let Some(selector) = b.spec.as_ref().and_then(|s| s.selector.clone()) else { continue };
        let selects = match Selector::try_from(selector) {
            Ok(s) => s.matches(labels),
            Err(e) => return Some(format!("PodDisruptionBudget {} has a selector that cannot be read ({e}): it stays", b.name_any())),
        };
        if !selects {
            continue;
        }
        let status = b.status.as_ref();
        let computed = status.is_some_and(|s| s.observed_generation.is_some() && s.observed_generation == b.metadata.generation);
        let allowed = status.and_then(|s| s.disruptions_allowed).unwrap_or(0);
        if !computed {
            return Some(format!("PodDisruptionBudget {} is not yet computed by the disruption controller: it stays", b.name_any()));
        }
        if allowed < 1 {
            let (healthy, desired) = status.map_or((0, 0), |s| (s.current_healthy.unwrap_or(0), s.desired_healthy.unwrap_or(0)));
            return Some(format!(
                "PodDisruptionBudget {} allows no disruption now ({healthy} healthy, {desired} needed): it stays until it does",
                b.name_any()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

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

    fn budget(name: &str, selector: Option<&[(&str, &str)]>, allowed: Option<i32>) -> PodDisruptionBudget {
        let mut b = PodDisruptionBudget::default();
        b.metadata.name = Some(name.into());
        b.metadata.generation = Some(2);
        b.spec = Some(PodDisruptionBudgetSpec {
            selector: selector.map(|kv| LabelSelector {
                match_labels: Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            }),
            ..Default::default()
        });
        b.status = allowed.map(|n| PodDisruptionBudgetStatus {
            disruptions_allowed: Some(n),
            current_healthy: Some(1),
            desired_healthy: Some(1 - n.min(1)),
            observed_generation: Some(2),
            ..Default::default()
        });
        b
    }

    fn labelled(app: &str) -> Pod {
        let mut p = pod(Some("move"), Some(("StatefulSet", true)));
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        p
    }

    #[test]
    fn a_budget_that_allows_no_disruption_keeps_the_pod() {
        let web = labelled("web");
        let blocking = budget("web-pdb", Some(&[("app", "web")]), Some(0));
        let why = budget_refusal(&web, std::slice::from_ref(&blocking)).expect("refused");
        assert!(why.contains("PodDisruptionBudget web-pdb allows no disruption"), "{why}");
        assert_eq!(budget_refusal(&web, &[budget("web-pdb", Some(&[("app", "web")]), Some(1))]), None, "one disruption allowed");
        assert_eq!(budget_refusal(&labelled("db"), std::slice::from_ref(&blocking)), None, "another app's budget");
        assert_eq!(budget_refusal(&web, &[budget("none", None, Some(0))]), None, "no selector selects nothing");
        let all = budget_refusal(&web, &[budget("all", Some(&[]), Some(0))]).expect("an empty selector selects every pod");
        assert!(all.contains("PodDisruptionBudget all"), "{all}");
        let fresh = budget_refusal(&web, &[budget("new", Some(&[("app", "web")]), None)]).expect("not computed yet");
        assert!(fresh.contains("not yet computed"), "{fresh}");
        let mut stale = budget("old", Some(&[("app", "web")]), Some(1));
        stale.metadata.generation = Some(3);
        assert!(budget_refusal(&web, &[stale]).is_some(), "status of an older spec");
        assert_eq!(budget_refusal(&web, &[]), None);
    }
}
