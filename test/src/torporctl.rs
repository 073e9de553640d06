//! torporctl against a node's shims and snapshot store: the one runner
//! ([`torporctl`], [`Node::torporctl`], [`Node::torporctl_json`]), the
//! actor records it shows, and the store's snapshots.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{run_env, Node, Output, COMMAND_LIMIT, POD_NAMESPACE};

/// The torporctl binary: `$TORPOR_CTL` or the build tree's.
pub fn torporctl_path() -> String {
    match std::env::var("TORPOR_CTL") {
        Ok(v) if !v.is_empty() => v,
        _ => concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/torporctl").to_string(),
    }
}

/// `torporctl <args>` against node A (not checked). A missing binary fails the test.
#[track_caller]
pub fn torporctl(args: &[&str]) -> Output {
    Node::a().torporctl(args)
}

/// `torporctl --json <args>` against node A, checked, parsed.
#[track_caller]
pub fn torporctl_json(args: &[&str]) -> Value {
    Node::a().torporctl_json(args)
}

/// The default actor id of a test pod: `<namespace>/<pod name>`.
pub fn default_actor(pod_name: &str) -> String {
    format!("{POD_NAMESPACE}/{pod_name}")
}

/// The snapshots of `actor` node A's store knows (`torporctl --json snapshots ls ACTOR`).
#[track_caller]
pub fn store_snapshots(actor: &str) -> Vec<Value> {
    Node::a().store_snapshots(actor)
}

impl Node {
    /// `torporctl <args>` against the node's shims and store (not checked).
    /// A missing binary fails the test.
    #[track_caller]
    pub fn torporctl(&self, args: &[&str]) -> Output {
        let bin = torporctl_path();
        assert!(Path::new(&bin).is_file(), "torporctl not found at {bin} (cargo build --release -p torporctl, or set TORPOR_CTL)");
        run_env(&bin, args, None, COMMAND_LIMIT, &self.torpor_env())
    }

    /// `torporctl --json <args>`, checked, parsed.
    #[track_caller]
    pub fn torporctl_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.torporctl(&all);
        let text = out.clone().ok();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("torporctl on node {}: not JSON ({e}): {out}", self.letter))
    }

    /// The actor record of `torporctl --json status NAME`, which must name
    /// exactly one actor, served by the shim `shim`.
    #[track_caller]
    pub fn actor_status(&self, name: &str, shim: &str) -> Value {
        let v = self.torporctl_json(&["status", name]);
        let arr = v.as_array().unwrap_or_else(|| panic!("torporctl --json status {name}: not a JSON array: {v}"));
        assert_eq!(arr.len(), 1, "exactly one actor for {name:?} on node {}: {v}", self.letter);
        assert_eq!(arr[0]["shim"].as_str(), Some(shim), "the actor named {name:?} is served by the shim {shim}: {v}");
        arr[0]["actor"].clone()
    }

    /// The snapshots of `actor` the node's store knows.
    #[track_caller]
    pub fn store_snapshots(&self, actor: &str) -> Vec<Value> {
        self.torporctl_json(&["snapshots", "ls", actor]).as_array().cloned().unwrap_or_default()
    }

    /// Removes every snapshot of `actor` from the node's store (best
    /// effort: for cleanups).
    pub fn remove_snapshots(&self, actor: &str) {
        let out = self.torporctl(&["--json", "snapshots", "ls", actor]);
        let Ok(v) = serde_json::from_str::<Value>(&out.stdout) else { return };
        for s in v.as_array().into_iter().flatten() {
            if let Some(name) = s["snapshot"].as_str() {
                let _ = self.torporctl(&["snapshots", "rm", name]);
            }
        }
    }

    /// Where the node's shims keep the record of the actor of shim `shim`
    /// (`<TORPOR_STATE_ROOT>/actors/<shim>`).
    pub fn actor_dir(&self, shim: &str) -> PathBuf {
        Path::new(&self.state_root).join("actors").join(shim)
    }

    /// The actor record file of shim `shim`, parsed, if there is one.
    pub fn actor_record(&self, shim: &str) -> Option<Value> {
        let text = std::fs::read(self.actor_dir(shim).join("actor.json")).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The control socket of shim `shim` (shim id = pod sandbox id).
    pub fn control_socket(&self, shim: &str) -> PathBuf {
        Path::new(&self.shim_socket_dir).join(format!("{shim}.sock"))
    }
}
