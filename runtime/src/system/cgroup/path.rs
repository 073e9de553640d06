//! An OCI `cgroupsPath` as the directory runc makes of it, relative to a
//! hierarchy's root, for both of runc's cgroup drivers:
//!
//! - cgroupfs: an absolute path, `/kubepods/burstable/pod<uid>/<id>`;
//! - systemd (`SystemdCgroup = true`): `slice:prefix:name`, e.g.
//!   `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`, which runc
//!   turns into the scope `cri-containerd-<id>.scope` below the slice's
//!   expansion `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`
//!   (a `-` in a slice name is one level of nesting).

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

/// The slice runc uses when the `slice` part is empty.
const DEFAULT_SLICE: &str = "system.slice";
const SLICE: &str = ".slice";

/// The directory (relative to a hierarchy's root) of OCI cgroupsPath
/// `cgroups_path`: a systemd `slice:prefix:name` if it does not start with
/// `/` (runc refuses any other form under its systemd driver), else a
/// cgroupfs path. Never a path out of the hierarchy.
pub fn relative_dir(cgroups_path: &str) -> Result<PathBuf> {
    if cgroups_path.starts_with('/') {
        return cgroupfs_dir(cgroups_path);
    }
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let [slice, prefix, name] = parts[..] else {
        return Err(invalid(cgroups_path, "neither an absolute cgroupfs path nor systemd's slice:prefix:name"));
    };
    systemd_dir(slice, prefix, name).map_err(|why| invalid(cgroups_path, &why))
}

/// A cgroupfs path (`/a/b`), relative; only plain components.
pub fn cgroupfs_dir(path: &str) -> Result<PathBuf> {
    plain(Path::new(path.trim_start_matches('/'))).map_err(|why| invalid(path, &why))
}

/// A path of plain components only (no `..`, `.`, or root): what stays
/// below the directory it is joined to.
pub(super) fn plain(rel: &Path) -> std::result::Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(format!("{rel:?} leaves its hierarchy")),
        }
    }
    Ok(out)
}

/// runc's systemd driver: the slice's expansion, then the unit (a scope
/// `<prefix>-<name>.scope`, or `name` itself when it is a slice).
fn systemd_dir(slice: &str, prefix: &str, name: &str) -> std::result::Result<PathBuf, String> {
    let slice = if slice.is_empty() { DEFAULT_SLICE } else { slice };
    let mut dir = expand_slice(slice)?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("unit name {name:?} is not a plain name"));
    }
    if prefix.contains('/') {
        return Err(format!("scope prefix {prefix:?} contains '/'"));
    }
    if name.ends_with(SLICE) {
        dir.push(name);
    } else {
        dir.push(format!("{prefix}-{name}.scope"));
    }
    Ok(dir)
}

/// systemd's slice nesting, as runc's `ExpandSlice`: `a-b-c.slice` is
/// `a.slice/a-b.slice/a-b-c.slice`; `-.slice` is the root.
pub fn expand_slice(slice: &str) -> std::result::Result<PathBuf, String> {
    let Some(stem) = slice.strip_suffix(SLICE) else {
        return Err(format!("slice {slice:?} does not end in .slice"));
    };
    if stem.is_empty() || slice.contains('/') {
        return Err(format!("slice {slice:?} is not a slice name"));
    }
    let mut dir = PathBuf::new();
    if stem == "-" {
        return Ok(dir);
    }
    let mut prefix = String::new();
    for part in stem.split('-') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("slice {slice:?} has an empty or dot component"));
        }
        dir.push(format!("{prefix}{part}{SLICE}"));
        prefix.push_str(part);
        prefix.push('-');
    }
    Ok(dir)
}

fn invalid(path: &str, why: &str) -> Error {
    Error::InvalidArgument(format!("cgroupsPath {path:?}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_systemd_slices_nest_at_each_dash() {
        assert_eq!(
            relative_dir("kubepods-burstable-pod0f1e.slice:cri-containerd:abc123").unwrap(),
            Path::new("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice/cri-containerd-abc123.scope")
        );
        assert_eq!(
            relative_dir("kubepods-pod9.slice:cri-containerd:c").unwrap(),
            Path::new("kubepods.slice/kubepods-pod9.slice/cri-containerd-c.scope")
        );
        // runc's defaults: system.slice; a name that is a slice is the unit.
        assert_eq!(relative_dir(":runc:c1").unwrap(), Path::new("system.slice/runc-c1.scope"));
        assert_eq!(relative_dir("-.slice:x:machine-a.slice").unwrap(), Path::new("machine-a.slice"));
        assert_eq!(expand_slice("-.slice").unwrap(), PathBuf::new());
    }

    #[test]
    fn cgroupfs_paths_are_relative_to_the_hierarchy() {
        assert_eq!(relative_dir("/kubepods/burstable/pod1/c").unwrap(), Path::new("kubepods/burstable/pod1/c"));
        assert_eq!(relative_dir("/rig-a/./c").unwrap(), Path::new("rig-a/c"));
    }

    #[test]
    fn nothing_leaves_the_hierarchy() {
        for bad in [
            "../etc",
            "/a/../../etc",
            "relative/path",
            "a:b",
            "a:b:c:d",
            "kubepods.slice:p:../../x",
            "kubepods.slice:p:a/b",
            "kube/pods.slice:p:c",
            "kubepods--x.slice:p:c",
            "-kubepods.slice:p:c",
            "kubepods:p:c",
            ".slice:p:c",
            "kubepods-...slice:p:c",
            "kubepods.slice:a/b:c",
            "kubepods.slice:p:",
        ] {
            let e = relative_dir(bad).expect_err(bad);
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        }
    }
}
