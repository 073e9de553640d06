//! What the agent writes to a pod: the state label, the applied-state
//! annotations, the `torpor.dev/Suspended` condition (status subresource)
//! and Events.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::state::{self, CONDITION, STATE_LABEL};

/// The changes to a pod's labels and annotations (None removes one).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MetaPatch {
    pub labels: Map<String, Value>,
    pub annotations: Map<String, Value>,
}

impl MetaPatch {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// Sets label `k` to `v` (None: removes it) unless the pod has that already.
    pub fn label(&mut self, pod: &Pod, k: &str, v: Option<&str>) {
        if pod.labels().get(k).map(String::as_str) != v {
            self.labels.insert(k.into(), v.map_or(Value::Null, |v| json!(v)));
        }
    }

    /// Sets annotation `k` to `v` (None: removes it) unless the pod has that already.
    pub fn annotation(&mut self, pod: &Pod, k: &str, v: Option<&str>) {
        if pod.annotations().get(k).map(String::as_str) != v {
            self.annotations.insert(k.into(), v.map_or(Value::Null, |v| json!(v)));
        }
    }

    pub fn to_json(&self) -> Value {
        let mut meta = Map::new();
        if !self.labels.is_empty() {
            meta.insert("labels".into(), Value::Object(self.labels.clone()));
        }
        if !self.annotations.is_empty() {
            meta.insert("annotations".into(), Value::Object(self.annotations.clone()));
        }
        json!({ "metadata": meta })
    }
}

/// The label, snapshot annotation and condition that say `actor_state`.
pub fn state_patch(pod: &Pod, actor_state: &str, snapshot: Option<&str>) -> MetaPatch {
    let mut p = MetaPatch::default();
    p.label(pod, STATE_LABEL, Some(&state::label_value(actor_state)));
    p.annotation(pod, state::SNAPSHOT, snapshot);
    p
}

/// The pod's [`CONDITION`]: (status, reason) if it has it.
pub fn condition(pod: &Pod) -> Option<(String, String)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == CONDITION)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// The condition's status and reason for an actor state.
pub fn condition_for(actor_state: &str) -> (&'static str, String) {
    let status = if actor_state == "SUSPENDED" { "True" } else { "False" };
    // CamelCase reason, as Kubernetes writes them: SUSPENDED -> Suspended
    let mut reason = String::new();
    for (i, c) in state::label_value(actor_state).chars().enumerate() {
        if c == '_' {
            continue;
        }
        reason.push(if i == 0 { c.to_ascii_uppercase() } else { c });
    }
    (status, reason)
}

/// Writes what the agent has to say on a pod: metadata (merge patch) and
/// the condition (strategic merge on the status subresource, by type).
pub struct Writer {
    pub api: Api<Pod>,
    pub recorder: Recorder,
}

impl Writer {
    pub async fn patch_meta(&self, pod: &Pod, p: &MetaPatch) -> Result<()> {
        if p.is_empty() {
            return Ok(());
        }
        let name = pod.name_any();
        let api = self.api_of(pod);
        api.patch(&name, &PatchParams::apply(state::MANAGER), &Patch::Merge(&p.to_json()))
            .await
            .map_err(Error::kube(format!("patch pod {}/{name}", pod.namespace().unwrap_or_default())))?;
        Ok(())
    }

    /// Sets the condition for `actor_state` unless the pod has it already.
    pub async fn set_condition(&self, pod: &Pod, actor_state: &str, message: &str) -> Result<()> {
        let (status, reason) = condition_for(actor_state);
        if condition(pod).is_some_and(|(s, r)| s == status && r == reason) {
            return Ok(());
        }
        self.put_condition(pod, CONDITION, status, &reason, message).await
    }

    /// Sets the pod condition `type_` (strategic merge on the status
    /// subresource: the pod's other conditions stay).
    pub async fn put_condition(&self, pod: &Pod, type_: &str, status: &str, reason: &str, message: &str) -> Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let body = json!({"status": {"conditions": [{
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
            "lastProbeTime": null,
        }]}});
        let name = pod.name_any();
        self.api_of(pod)
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
            .map_err(Error::kube(format!("patch status of pod {}/{name}", pod.namespace().unwrap_or_default())))?;
        Ok(())
    }

    /// Resizes the pod's requests to `target` through the `pods/resize`
    /// subresource (in-place pod resize; limits untouched): the pod as the
    /// API server has it after.
    pub async fn resize(&self, pod: &Pod, target: &crate::resize::Requests) -> Result<Pod> {
        let name = pod.name_any();
        let pp = PatchParams { field_manager: Some(state::MANAGER.into()), ..Default::default() };
        self.api_of(pod)
            .patch_subresource("resize", &name, &pp, &Patch::Strategic(&crate::resize::resize_patch(target)))
            .await
            .map_err(Error::kube(format!("resize pod {}/{name} (pods/resize)", pod.namespace().unwrap_or_default())))
    }

    /// Deletes the pod, this pod alone (a precondition on its uid: never a
    /// pod of the same name made since).
    pub async fn delete(&self, pod: &Pod) -> Result<()> {
        let name = pod.name_any();
        let dp = DeleteParams { preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }), ..Default::default() };
        self.api_of(pod)
            .delete(&name, &dp)
            .await
            .map_err(Error::kube(format!("delete pod {}/{name}", pod.namespace().unwrap_or_default())))?;
        Ok(())
    }

    /// The PodDisruptionBudgets of the pod's namespace.
    pub async fn budgets(&self, pod: &Pod) -> Result<Vec<PodDisruptionBudget>> {
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.api.clone().into_client(), &ns);
        let list = api.list(&ListParams::default()).await.map_err(Error::kube(format!("list poddisruptionbudgets of namespace {ns}")))?;
        Ok(list.items)
    }

    /// Publishes an Event on the pod (failures are logged: an Event is not
    /// worth stopping for).
    pub async fn event(&self, pod: &Pod, warning: bool, reason: &str, action: &str, note: String) {
        let ev = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        let reference = pod.object_ref(&());
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            tracing::warn!(pod = %pod.name_any(), reason, "publish event: {e}");
        }
    }

    fn api_of(&self, pod: &Pod) -> Api<Pod> {
        match pod.namespace() {
            Some(ns) => Api::namespaced(self.api.clone().into_client(), &ns),
            None => self.api.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        p
    }

    #[test]
    fn patches_only_what_changes() {
        let p = pod(&[(STATE_LABEL, "running")]);
        assert!(state_patch(&p, "RUNNING", None).is_empty());
        let sp = state_patch(&p, "SUSPENDED", Some("ns/a@2"));
        assert_eq!(sp.to_json(), json!({"metadata": {"labels": {STATE_LABEL: "suspended"}, "annotations": {state::SNAPSHOT: "ns/a@2"}}}));
        let mut m = MetaPatch::default();
        m.annotation(&p, state::APPLIED, None);
        assert!(m.is_empty(), "removing what is not there is no change");
    }

    #[test]
    fn conditions() {
        assert_eq!(condition_for("SUSPENDED"), ("True", "Suspended".to_string()));
        assert_eq!(condition_for("RUNNING"), ("False", "Running".to_string()));
        assert_eq!(condition_for("UNKNOWN(3)"), ("False", "Unknown".to_string()));
    }
}
