//! The settings of one rig node (its containerd, CRI endpoint, tools,
//! state dir and cgroup parent), read from the environment that
//! `test/rig/env.sh` exports. Node A's are [`crate::rig`].

use std::path::Path;

/// Where the rig is and what is under test.
#[derive(Debug, Clone)]
pub struct Rig {
    /// containerd gRPC socket path.
    pub address: String,
    /// CRI endpoint for crictl (`unix://...`).
    pub cri_endpoint: String,
    pub crictl: String,
    pub ctr: String,
    /// The rig's volatile state dir (containerd state, sockets, netns).
    pub state_dir: String,
    /// The rig's containerd state dir.
    pub containerd_state: String,
    /// CRI runtime handler under test (`torpor` or `runc`).
    pub runtime: String,
    /// crictl's per-RPC timeout.
    pub crictl_timeout: String,
    /// Parent cgroup (cgroupfs driver, below each hierarchy's root) of the
    /// test pods; down.sh removes what is left of it.
    pub cgroup: String,
    /// The rig's CRI handlers drive cgroups through systemd
    /// (`TORPOR_RIG_SYSTEMD_CGROUP=1`, test/rig/up.sh): pods get a slice.
    pub systemd_cgroup: bool,
}

impl Rig {
    /// The CRI cgroup parent of pod `name`: `/<cgroup>/pod-<name>` (cgroupfs),
    /// or under systemd the slice `<cgroup>-pod_<name>.slice` (nested in
    /// `<cgroup>.slice`, as kubelet's `kubepods-besteffort-pod<uid>.slice`;
    /// `-` nests in slice names, so the words use `_`).
    pub fn pod_cgroup_parent(&self, name: &str) -> String {
        if self.systemd_cgroup {
            format!("{}-pod_{}.slice", self.cgroup.replace('-', "_"), name.replace('-', "_"))
        } else {
            format!("/{}/pod-{name}", self.cgroup)
        }
    }
}

pub(crate) fn env_or(key: &str, default: &str) -> String {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => v,
        _ => default.to_string(),
    }
}

fn find_binary(env_key: &str, name: &str) -> String {
    if let Ok(v) = std::env::var(env_key) {
        if !v.is_empty() {
            return v;
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/local/bin", "/usr/bin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    // Let the spawn fail with a clear message.
    name.to_string()
}

impl Rig {
    /// The settings of a node whose state dir is `state_dir`.
    pub(crate) fn for_node(state_dir: String, address: String, cgroup: String) -> Rig {
        let cri_endpoint = format!("unix://{address}");
        Rig {
            containerd_state: format!("{state_dir}/containerd"),
            crictl: find_binary("TORPOR_CRICTL", "crictl"),
            ctr: find_binary("TORPOR_CTR", "ctr"),
            runtime: env_or("TORPOR_TEST_RUNTIME", "torpor"),
            crictl_timeout: env_or("TORPOR_CRICTL_TIMEOUT", "120s"),
            cgroup,
            systemd_cgroup: env_or("TORPOR_RIG_SYSTEMD_CGROUP", "0") == "1",
            address,
            cri_endpoint,
            state_dir,
        }
    }
}
