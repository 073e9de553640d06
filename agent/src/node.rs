//! The actors on this node, through the shims' control sockets (the same
//! client and socket directory as torporctl).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use torporctl::control::{self, CallError, Op, Probe};

use crate::error::{Error, Result};

/// One actor as its shim reports it.
#[derive(Debug, Clone)]
pub struct Actor {
    /// Its shim's control socket.
    pub sock: PathBuf,
    /// The actor record (torporctl's `--json` shape: `actor`, `state`, `generation`, ...).
    pub record: Value,
}

impl Actor {
    pub fn id(&self) -> &str {
        self.record["actor"].as_str().unwrap_or("")
    }

    /// The uid of the Kubernetes pod the actor runs in (the shim's record,
    /// from CRI's sandbox metadata), if it runs in one.
    pub fn pod_uid(&self) -> Option<&str> {
        self.record["pod_uid"].as_str().filter(|u| !u.is_empty())
    }

    pub fn state(&self) -> &str {
        self.record["state"].as_str().unwrap_or("")
    }

    /// `<actor>@<generation>` of its snapshot in the store, if it has one.
    pub fn snapshot(&self) -> Option<String> {
        let s = &self.record["snapshot"];
        Some(format!("{}@{}", s["actor"].as_str()?, s["generation"].as_u64()?))
    }
}

/// The actors of the shims in `socket_dir` that run in a Kubernetes pod,
/// by the pod's uid: the shim's own record of the pod it serves, which no
/// pod author can change (a pod's annotations can name any actor). Shims
/// that are dead, old or do not answer are left out (and logged), and so
/// are actors outside Kubernetes (`ctr` containers).
pub async fn actors(socket_dir: &Path) -> Result<BTreeMap<String, Actor>> {
    let socks = control::list_shims(socket_dir).map_err(Error::Node)?;
    let mut out = BTreeMap::new();
    for sock in socks {
        match control::status(&sock).await {
            Probe::Status(v) if v["actor"].is_object() => {
                let a = Actor { sock, record: v["actor"].clone() };
                if let Some(uid) = a.pod_uid() {
                    out.insert(uid.to_string(), a);
                }
            }
            Probe::Status(_) | Probe::Dead => {}
            Probe::Legacy(_) => tracing::warn!(sock = %sock.display(), "{}", control::LEGACY_SHIM),
            Probe::Failed(e) => tracing::warn!(sock = %sock.display(), "status: {e}"),
        }
    }
    Ok(out)
}

/// Runs `op` on the actor; its record afterwards, or why it failed.
pub async fn call(actor: &Actor, op: Op) -> std::result::Result<Value, String> {
    match control::call(&actor.sock, op).await {
        Ok(v) => Ok(v["actor"].clone()),
        Err(CallError::Failed(f)) => Err(format!("{} ({})", f.message, f.reason.describe())),
        Err(e) => Err(e.to_string()),
    }
}
