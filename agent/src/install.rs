//! The install's side of the API: which nodes run torpor and when it goes.
//!
//! - A node opts in with the label [`ENABLED`] (the DaemonSet's
//!   nodeSelector); once torpor works there (the snapshotter's store
//!   answers and the kubelet reports the `torpor` runtime handler in
//!   `Node.status.runtimeHandlers`) the node pod labels it [`READY`], the
//!   RuntimeClass's `scheduling.nodeSelector`; the pod's preStop hook
//!   removes that label first.
//! - Uninstall: [`uninstall`] (`kubectl torpor uninstall`, the Helm
//!   chart's pre-delete hook) refuses while torpor pods exist on the nodes,
//!   else makes the DaemonSet select no node; each node pod's preStop then
//!   asks [`intent`], which answers "uninstall" only when the API says so
//!   (the DaemonSet gone, or no longer selecting the node) and fails
//!   closed (torpor stays installed) on any error, 401/403 included.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::state::RUNTIME_CLASS;

/// The opt-in label of a node (the DaemonSet's nodeSelector).
pub const ENABLED: &str = "torpor.dev/enabled";
/// The label the node pod sets once torpor works on the node (the
/// RuntimeClass's scheduling.nodeSelector).
pub const READY: &str = "torpor.dev/ready";
/// The DaemonSet's nodeSelector key that matches no node: the uninstall.
pub const UNINSTALL: &str = "torpor.dev/uninstall";
/// DaemonSet annotation: the uninstall also removes the node's data.
pub const WIPE: &str = "torpor.dev/uninstall-wipe";

/// Waits until the kubelet reports `handler` among the node's runtime
/// handlers, then labels the node [`READY`].
pub async fn label_ready(client: &Client, node: &str, handler: &str, timeout: Duration) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let n = api.get(node).await.map_err(Error::kube(format!("get node {node}")))?;
        let handlers = runtime_handlers(&n);
        if handlers.iter().any(|h| h == handler) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Error::Wait(format!(
                "node {node}: the kubelet does not report the runtime handler {handler:?} after {} s (it reports {handlers:?}): containerd did not load the drop-in (does its main config import it? see the install container's log)",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    set_label(client, node, Some("true")).await
}

/// Removes the [`READY`] label (no error when it is not there).
pub async fn unlabel(client: &Client, node: &str) -> Result<()> {
    set_label(client, node, None).await
}

async fn set_label(client: &Client, node: &str, value: Option<&str>) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let body = json!({"metadata": {"labels": {READY: value}}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(Error::kube(format!("label node {node} {READY}={}", value.unwrap_or("(removed)"))))?;
    Ok(())
}

/// The CRI runtime handlers the kubelet reports for the node.
pub fn runtime_handlers(n: &Node) -> Vec<String> {
    n.status.as_ref().and_then(|s| s.runtime_handlers.as_ref()).into_iter().flatten().filter_map(|h| h.name.clone()).collect()
}

/// What the preStop hook of the node pod is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intent {
    /// An upgrade or a restart of the pod: leave torpor installed.
    Stay,
    /// Uninstall from this node (and remove its data when `wipe`).
    Uninstall { wipe: bool },
}

/// Whether the DaemonSet's pod template's nodeSelector selects a node of these labels.
pub fn selects(ds: &DaemonSet, labels: &BTreeMap<String, String>) -> bool {
    let sel = ds.spec.template.spec.as_ref().and_then(|s| s.node_selector.as_ref());
    sel.into_iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
}

/// The preStop hook's question: is torpor leaving this node? Only a
/// definite answer of the API counts: the DaemonSet gone (404) or being
/// deleted, or no longer selecting the node. Every error, 401 and 403
/// included, is returned (the caller leaves torpor installed: fail closed).
pub async fn intent(client: &Client, namespace: &str, daemonset: &str, node: &str) -> Result<Intent> {
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let ds = match dss.get_opt(daemonset).await.map_err(Error::kube(format!("get DaemonSet {namespace}/{daemonset}")))? {
        None => return Ok(Intent::Uninstall { wipe: false }),
        Some(ds) => ds,
    };
    let wipe = ds.annotations().get(WIPE).map(String::as_str) == Some("true");
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Intent::Uninstall { wipe });
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.get(node).await.map_err(Error::kube(format!("get node {node}")))?;
    if selects(&ds, n.labels()) {
        Ok(Intent::Stay)
    } else {
        Ok(Intent::Uninstall { wipe })
    }
}

/// The pods of RuntimeClass torpor on `node` (all of them when None):
/// `namespace/name (node)`.
pub async fn torpor_pods(client: &Client, node: Option<&str>) -> Result<Vec<String>> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut lp = ListParams::default();
    if let Some(n) = node {
        lp = lp.fields(&format!("spec.nodeName={n}"));
    }
    let list = api.list(&lp).await.map_err(Error::kube("list pods"))?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()) == Some(RUNTIME_CLASS))
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "unscheduled".into());
            format!("{}/{} ({node})", p.namespace().unwrap_or_default(), p.name_any())
        })
        .collect())
}

/// How an uninstall went, per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// Nodes whose pod went and whose kubelet no longer reports the handler.
    pub nodes: Vec<String>,
}

/// The uninstall of torpor from every node, before its objects are
/// deleted: refuses while torpor pods exist (unless `force`), then makes
/// the DaemonSet select no node (annotated [`WIPE`] when `wipe`), waits
/// for its pods to go and for each of their nodes to stop reporting the
/// `torpor` runtime handler (their preStop hooks uninstalled).
pub async fn uninstall(
    client: &Client,
    namespace: &str,
    daemonset: &str,
    wipe: bool,
    force: bool,
    timeout: Duration,
) -> Result<Uninstalled> {
    let pods = torpor_pods(client, None).await?;
    if !pods.is_empty() && !force {
        return Err(Error::Refused(format!(
            "{} pod(s) of RuntimeClass {RUNTIME_CLASS} exist: {}. Delete them first (their actors' snapshots stay in the store), or uninstall with --force (their shims lose their runtime)",
            pods.len(),
            pods.join(", ")
        )));
    }
    let dss: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let ds = dss.get(daemonset).await.map_err(Error::kube(format!("get DaemonSet {namespace}/{daemonset}")))?;
    let selector = ds.spec.selector.match_labels.clone().unwrap_or_default();
    let label_sel = selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let podapi: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let before = podapi.list(&ListParams::default().labels(&label_sel)).await.map_err(Error::kube("list the node pods"))?;
    let nodes: Vec<String> = before.items.iter().filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone())).collect();
    let body = json!({
        "metadata": {"annotations": {WIPE: if wipe { Some("true") } else { None }}},
        "spec": {"template": {"spec": {"nodeSelector": {UNINSTALL: "true"}}}},
    });
    dss.patch(daemonset, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(Error::kube(format!("patch DaemonSet {namespace}/{daemonset}")))?;
    let deadline = Instant::now() + timeout;
    loop {
        let left = podapi.list(&ListParams::default().labels(&label_sel)).await.map_err(Error::kube("list the node pods"))?;
        if left.items.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = left.items.iter().map(|p| p.name_any()).collect();
            return Err(Error::Wait(format!("the node pods {names:?} are still there after {} s", timeout.as_secs())));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let napi: Api<Node> = Api::all(client.clone());
    for n in &nodes {
        loop {
            let node = napi.get(n).await.map_err(Error::kube(format!("get node {n}")))?;
            if !runtime_handlers(&node).iter().any(|h| h == RUNTIME_CLASS) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Wait(format!(
                    "node {n} still reports the runtime handler {RUNTIME_CLASS} after {} s: its node pod's preStop did not uninstall (it left torpor installed; on the node: {})",
                    timeout.as_secs(),
                    "node.sh uninstall in the node image, or remove the containerd drop-in and restart containerd"
                )));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    Ok(Uninstalled { nodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(sel: &[(&str, &str)]) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "torpor-node"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [], "nodeSelector": sel.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_node_is_selected_by_every_key_of_the_node_selector() {
        let labels: BTreeMap<String, String> =
            [(ENABLED.to_string(), "true".to_string()), ("kubernetes.io/os".into(), "linux".into())].into();
        assert!(selects(&ds(&[(ENABLED, "true")]), &labels));
        assert!(selects(&ds(&[]), &labels), "no nodeSelector: every node");
        assert!(!selects(&ds(&[(ENABLED, "true"), (UNINSTALL, "true")]), &labels), "the uninstall selects no node");
        assert!(!selects(&ds(&[(ENABLED, "yes")]), &labels));
        let none = BTreeMap::new();
        assert!(!selects(&ds(&[(ENABLED, "true")]), &none), "a node that did not opt in");
    }
}
