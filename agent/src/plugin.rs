//! `kubectl torpor`: status, suspend, resume and snapshots of torpor pods
//! through the API server alone (no access to the node): requests are the
//! [`DESIRED`] annotation, answers what the node agent wrote on the pod.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::state::{self, Desired, APPLIED, DESIRED, RESULT, RUNTIME_CLASS, SNAPSHOT, STATE_LABEL};

/// Which pods a command is about.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Pods named on the command line (in `namespace`).
    pub names: Vec<String>,
    /// The namespace (None: the kubeconfig context's).
    pub namespace: Option<String>,
    /// Every namespace.
    pub all_namespaces: bool,
    /// A label selector.
    pub selector: Option<String>,
}

/// The pods of RuntimeClass torpor the selection names.
pub async fn pods(client: &Client, sel: &Selection) -> Result<Vec<Pod>> {
    let ns = sel.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    if !sel.names.is_empty() {
        if sel.all_namespaces || sel.selector.is_some() {
            return Err(Error::Usage("name pods, or select them with -l / -A, not both".into()));
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let mut out = Vec::new();
        for n in &sel.names {
            let p = api.get(n).await.map_err(Error::kube(format!("get pod {ns}/{n}")))?;
            if !is_torpor(&p) {
                return Err(Error::Usage(format!("pod {ns}/{n} does not run under RuntimeClass {RUNTIME_CLASS}")));
            }
            out.push(p);
        }
        return Ok(out);
    }
    let api: Api<Pod> = if sel.all_namespaces { Api::all(client.clone()) } else { Api::namespaced(client.clone(), &ns) };
    let mut lp = ListParams::default();
    if let Some(s) = &sel.selector {
        lp = lp.labels(s);
    }
    let list = api.list(&lp).await.map_err(Error::kube("list pods"))?;
    let mut v: Vec<Pod> = list.items.into_iter().filter(is_torpor).collect();
    v.sort_by_key(|p| (p.namespace(), p.name_any()));
    Ok(v)
}

fn is_torpor(p: &Pod) -> bool {
    p.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()) == Some(RUNTIME_CLASS)
}

/// The actor id the shim gives `p`'s actor: `torpor.dev/actor` within the
/// pod's namespace (a bare name is `<namespace>/<name>`), else
/// `<namespace>/<pod name>`. For display only: the agent finds a pod's
/// actor by the pod's uid in the shim's record.
pub fn actor_id(p: &Pod) -> String {
    let ns = p.namespace().unwrap_or_default();
    match p.annotations().get(state::ACTOR).filter(|a| !a.is_empty()) {
        Some(a) if a.contains('/') => a.clone(),
        Some(a) => format!("{ns}/{a}"),
        None => format!("{ns}/{}", p.name_any()),
    }
}

/// A pod's torpor status as `-o json` prints it.
pub fn status_json(p: &Pod) -> Value {
    let a = p.annotations();
    let cond = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == state::CONDITION))
        .map(|c| json!({"status": c.status, "reason": c.reason, "message": c.message, "lastTransitionTime": c.last_transition_time.as_ref().map(|t| t.0.to_string())}));
    json!({
        "namespace": p.namespace(),
        "name": p.name_any(),
        "node": p.spec.as_ref().and_then(|s| s.node_name.clone()),
        "actor": actor_id(p),
        "state": p.labels().get(STATE_LABEL),
        "desired": a.get(DESIRED),
        "applied": a.get(APPLIED),
        "result": a.get(RESULT),
        "snapshot": a.get(SNAPSHOT),
        "condition": cond,
    })
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// The status table.
pub fn status_table(rows: &[Value]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{:<16} {:<28} {:<10} {:<10} {:<10} {:<28} RESULT", "NAMESPACE", "NAME", "NODE", "STATE", "DESIRED", "SNAPSHOT");
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:<28} {:<10} {:<10} {:<10} {:<28} {}",
            s(&r["namespace"]),
            s(&r["name"]),
            s(&r["node"]),
            s(&r["state"]),
            s(&r["desired"]),
            s(&r["snapshot"]),
            s(&r["result"]),
        );
    }
    out
}

/// The snapshots table.
pub fn snapshots_table(rows: &[Value]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{:<16} {:<28} {:<10} {:<32} SNAPSHOT", "NAMESPACE", "NAME", "STATE", "ACTOR");
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:<28} {:<10} {:<32} {}",
            s(&r["namespace"]),
            s(&r["name"]),
            s(&r["state"]),
            s(&r["actor"]),
            s(&r["snapshot"])
        );
    }
    out
}

/// Asks for `d` on each pod (and forgets the last applied request, so that
/// asking again acts again).
pub async fn request(client: &Client, pods: &[Pod], d: Desired) -> Result<()> {
    let body = json!({"metadata": {"annotations": {DESIRED: d.as_str(), APPLIED: null, RESULT: null}}});
    for p in pods {
        let ns = p.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(Error::kube(format!("annotate pod {ns}/{}", p.name_any())))?;
    }
    Ok(())
}

/// How a request on a pod ended, from what the agent wrote.
pub fn outcome(p: &Pod, d: Desired) -> Option<std::result::Result<(), String>> {
    let a = p.annotations();
    if a.get(APPLIED).map(String::as_str) != Some(d.as_str()) {
        return None;
    }
    let result = a.get(RESULT).cloned().unwrap_or_default();
    if !result.starts_with("ok") {
        return Some(Err(result));
    }
    // the label follows in the same patch
    let label = state::label_value(d.actor_state());
    (p.labels().get(STATE_LABEL) == Some(&label)).then_some(Ok(()))
}

/// Waits until the agent applied `d` on each pod, all pods at once; their
/// status then.
pub async fn wait(client: &Client, pods: &[Pod], d: Desired, timeout: Duration) -> Result<Vec<Pod>> {
    let deadline = Instant::now() + timeout;
    futures::future::try_join_all(pods.iter().map(|p| wait_one(client, p, d, deadline, timeout))).await
}

async fn wait_one(client: &Client, p: &Pod, d: Desired, deadline: Instant, timeout: Duration) -> Result<Pod> {
    let ns = p.namespace().unwrap_or_default();
    let name = p.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    loop {
        let now = api.get(&name).await.map_err(Error::kube(format!("get pod {ns}/{name}")))?;
        match outcome(&now, d) {
            Some(Ok(())) => return Ok(now),
            Some(Err(e)) => return Err(Error::Wait(format!("pod {ns}/{name}: {}: {e}", d.as_str()))),
            None => {}
        }
        if Instant::now() >= deadline {
            return Err(Error::Wait(format!(
                "pod {ns}/{name}: not {} within {} s (state {:?}; is torpor-agent running on its node?)",
                d.as_str(),
                timeout.as_secs(),
                now.labels().get(STATE_LABEL)
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The wide status table (`-o wide`): also the actor, what was applied and the condition.
pub fn status_table_wide(rows: &[Value]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<28} {:<10} {:<10} {:<10} {:<10} {:<32} {:<10} {:<28} RESULT",
        "NAMESPACE", "NAME", "NODE", "STATE", "DESIRED", "APPLIED", "ACTOR", "CONDITION", "SNAPSHOT"
    );
    for r in rows {
        let cond = match (r["condition"]["status"].as_str(), r["condition"]["reason"].as_str()) {
            (Some(st), Some(re)) => format!("{st}/{re}"),
            (Some(st), None) => st.to_string(),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<16} {:<28} {:<10} {:<10} {:<10} {:<10} {:<32} {:<10} {:<28} {}",
            s(&r["namespace"]),
            s(&r["name"]),
            s(&r["node"]),
            s(&r["state"]),
            s(&r["desired"]),
            s(&r["applied"]),
            s(&r["actor"]),
            cond,
            s(&r["snapshot"]),
            s(&r["result"]),
        );
    }
    out
}

/// `v` as YAML (`-o yaml`): block style, strings quoted as JSON (valid YAML).
pub fn to_yaml(v: &Value) -> String {
    let mut out = String::new();
    yaml_into(v, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn yaml_scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

fn is_block(v: &Value) -> bool {
    matches!(v, Value::Array(a) if !a.is_empty()) || matches!(v, Value::Object(o) if !o.is_empty())
}

fn yaml_into(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Array(a) if !a.is_empty() => {
            for item in a {
                if is_block(item) {
                    out.push_str(&format!("{pad}-\n"));
                    yaml_into(item, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}- {}\n", yaml_scalar(item)));
                }
            }
        }
        Value::Object(o) if !o.is_empty() => {
            for (k, item) in o {
                let key = Value::String(k.clone()).to_string();
                if is_block(item) {
                    out.push_str(&format!("{pad}{key}:\n"));
                    yaml_into(item, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{key}: {}\n", yaml_scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", yaml_scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ann: &[(&str, &str)], label: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.annotations = Some(ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        if let Some(l) = label {
            p.metadata.labels = Some([(STATE_LABEL.to_string(), l.to_string())].into());
        }
        p
    }

    #[test]
    fn outcomes() {
        let d = Desired::Suspended;
        assert_eq!(outcome(&pod(&[(DESIRED, "suspended")], Some("running")), d), None, "not applied yet");
        let ok = pod(&[(APPLIED, "suspended"), (RESULT, "ok: suspend in 80 ms")], Some("suspended"));
        assert_eq!(outcome(&ok, d), Some(Ok(())));
        let failed = pod(&[(APPLIED, "suspended"), (RESULT, "failed: suspend: criu")], Some("running"));
        assert_eq!(outcome(&failed, d), Some(Err("failed: suspend: criu".into())));
        let v = status_json(&ok);
        assert_eq!(v["state"], "suspended");
        assert_eq!(v["actor"], "ns/web");
        assert!(status_table(std::slice::from_ref(&v)).contains("ns               web"));
        let wide = status_table_wide(&[v]);
        assert!(wide.lines().next().unwrap().contains("ACTOR") && wide.contains("ns/web"), "{wide}");
    }

    #[test]
    fn yaml_output_is_block_yaml_of_the_json() {
        let v = json!([{"name": "web", "n": 1, "condition": null, "tags": [], "c": {"status": "True", "msg": "a: b"}}]);
        let y = to_yaml(&v);
        assert_eq!(y, "-\n  \"c\":\n    \"msg\": \"a: b\"\n    \"status\": \"True\"\n  \"condition\": null\n  \"n\": 1\n  \"name\": \"web\"\n  \"tags\": []\n");
        assert_eq!(to_yaml(&json!([])), "[]\n");
    }
}
