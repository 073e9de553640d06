//! An OCI bundle's `config.json`, read once at create, and what torpor
//! needs of it: namespaces, cgroup, and the CRI annotations that say which
//! pod (shim group) a container belongs to and whether it is the sandbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::error::{Error, IoContext, Result};

/// CRI annotations: which container is the sandbox, which pod it is in,
/// and its name in the pod.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

/// Annotations whose value groups containers into one shim: the CRI sandbox
/// id (one shim per pod), or an explicit group for `ctr` users.
pub const GROUP_LABELS: [&str; 3] = [CRI_SANDBOX_ID, "io.containerd.torpor.v1.group", "io.containerd.runc.v2.group"];

/// Reads the bundle's OCI spec.
pub fn read_spec(bundle: &Path) -> Result<Spec> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).io_context(|| format!("read {path:?}"))?;
    serde_json::from_slice(&text).map_err(|source| Error::Json { context: format!("parse {path:?}"), source })
}

/// What torpor takes from a container's spec.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub annotations: HashMap<String, String>,
    /// The container has its own pid namespace (if not, its processes are
    /// killed when init exits, as runc-v2 does).
    pub own_pid_ns: bool,
    /// The pod's network namespace (a path: CRI's sandbox netns), if joined.
    pub netns: Option<PathBuf>,
    /// The pod's IPC namespace (a path: CRI's sandbox's), if joined.
    pub ipcns: Option<PathBuf>,
    /// The CRI sandbox (pause) container: never part of the actor.
    pub sandbox: bool,
    /// The OCI `cgroupsPath`.
    pub cgroups_path: Option<String>,
}

impl ContainerSpec {
    pub fn of(spec: &Spec) -> ContainerSpec {
        let namespaces = spec.linux().as_ref().and_then(|l| l.namespaces().as_ref());
        let annotations = spec.annotations().clone().unwrap_or_default();
        ContainerSpec {
            own_pid_ns: namespaces.is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_none())),
            netns: namespaces.and_then(|ns| ns.iter().find(|n| n.typ() == LinuxNamespaceType::Network)).and_then(|n| n.path().clone()),
            ipcns: namespaces.and_then(|ns| ns.iter().find(|n| n.typ() == LinuxNamespaceType::Ipc)).and_then(|n| n.path().clone()),
            sandbox: annotations.get(CRI_CONTAINER_TYPE).is_some_and(|t| t == "sandbox"),
            cgroups_path: spec.linux().as_ref().and_then(|l| l.cgroups_path().as_ref()).map(|p| p.to_string_lossy().into_owned()),
            annotations,
        }
    }

    /// The shim group (pod) of container `id`: its group label, else its id.
    pub fn group(&self, id: &str) -> String {
        GROUP_LABELS.iter().find_map(|l| self.annotations.get(*l)).cloned().unwrap_or_else(|| id.to_string())
    }
}

/// The mount points where `spec` has runc make a fresh tmpfs: its `tmpfs`
/// mounts, and its `cgroup` mount (a tmpfs on cgroup v1).
pub fn fresh_tmpfs_mounts(spec: &Spec) -> Vec<String> {
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| matches!(m.typ().as_deref(), Some("tmpfs" | "cgroup")))
        .map(|m| m.destination().to_string_lossy().into_owned())
        .collect()
}

/// The shim a container of `bundle` (id `id`) is served by.
pub fn group_of(bundle: &Path, id: &str) -> String {
    read_spec(bundle).map(|s| ContainerSpec::of(&s).group(id)).unwrap_or_else(|_| id.to_string())
}

/// The cgroup (OCI `cgroupsPath`) of the container of `bundle`.
pub fn cgroup_of_bundle(bundle: &Path) -> Option<String> {
    ContainerSpec::of(&read_spec(bundle).ok()?).cgroups_path
}

/// The umask a container's processes get when its spec names none: runc
/// gives it to init, but an exec'd process inherits runc's own, which is the
/// shim's (077, so that torpor's files are root's alone).
pub const DEFAULT_UMASK: u32 = 0o022;

/// Sets [`DEFAULT_UMASK`] as `spec`'s `process.user.umask` when it names
/// none, so every process of the container (init and execs) gets the umask
/// it would under runc-v2. A spec that sets one is left alone.
pub fn pin_umask(spec: &mut serde_json::Value) {
    let Some(user) = spec.get_mut("process").and_then(|p| p.get_mut("user")).and_then(|u| u.as_object_mut()) else {
        return; // no process (a spec for checkpoint/restore only)
    };
    user.entry("umask").or_insert_with(|| serde_json::json!(DEFAULT_UMASK));
}

/// The bundle's `config.json` as a JSON value, to be changed in place
/// (fields oci-spec does not model are kept as they are).
pub fn read_spec_json(bundle: &Path) -> Result<serde_json::Value> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).io_context(|| format!("read {path:?}"))?;
    serde_json::from_slice(&text).map_err(|source| Error::Json { context: format!("parse {path:?}"), source })
}

/// Replaces the bundle's `config.json` with `spec` (temporary file, rename).
pub fn write_spec_json(bundle: &Path, spec: &serde_json::Value) -> Result<()> {
    let (tmp, path) = (bundle.join(".config.json.tmp"), bundle.join("config.json"));
    let out = serde_json::to_vec(spec).map_err(|source| Error::Json { context: "encode config.json".into(), source })?;
    std::fs::write(&tmp, out).io_context(|| format!("write {tmp:?}"))?;
    std::fs::rename(&tmp, &path).io_context(|| format!("rename {tmp:?}"))
}

/// Refuses a checkpoint image directory that is missing or holds no CRIU image.
pub fn check_image(image: &Path) -> Result<()> {
    if !image.is_dir() {
        return Err(Error::InvalidArgument(format!("checkpoint image directory {image:?} does not exist")));
    }
    if !image.join("inventory.img").is_file() {
        return Err(Error::InvalidArgument(format!("checkpoint image directory {image:?} holds no CRIU image (no inventory.img)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_umask_is_pinned_and_a_given_one_kept() {
        let mut v: serde_json::Value =
            serde_json::from_str(r#"{"ociVersion":"1.2.0","process":{"user":{"uid":0,"gid":0},"args":["sh"]}}"#).unwrap();
        pin_umask(&mut v);
        assert_eq!(v["process"]["user"]["umask"], 18);
        assert_eq!(v["process"]["args"][0], "sh");
        let mut v: serde_json::Value = serde_json::from_str(r#"{"process":{"user":{"uid":0,"gid":0,"umask":63}}}"#).unwrap();
        pin_umask(&mut v);
        assert_eq!(v["process"]["user"]["umask"], 63);
        // Through the bundle, as adapt_spec writes it.
        let b = tempfile::tempdir().unwrap();
        std::fs::write(b.path().join("config.json"), r#"{"process":{"user":{"uid":0,"gid":0}}}"#).unwrap();
        let mut v = read_spec_json(b.path()).unwrap();
        pin_umask(&mut v);
        write_spec_json(b.path(), &v).unwrap();
        assert_eq!(read_spec_json(b.path()).unwrap()["process"]["user"]["umask"], 18);
    }
}
