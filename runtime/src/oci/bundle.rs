//! The bundle of an app container, as torpor adapts it at create: the
//! request directory bind-mounted at `/run/torpor`, and torpor's CRIU
//! configuration (`org.criu.config`).
//!
//! The request directory is written by the container: it is a tmpfs of its
//! own ([`REQUEST_TMPFS`]: 4 KiB, 8 inodes, nosuid, nodev, noexec), so that
//! a container cannot fill the host's `/run` through it. It is mounted at
//! the first create of the pod and unmounted by [`remove_request_dir`].

use std::path::{Path, PathBuf};

use std::os::unix::fs::MetadataExt;

use nix::mount::{MntFlags, MsFlags};
use serde_json::{json, Value};

use crate::error::{Error, IoContext, Result};
use crate::oci::spec::{pin_umask, read_spec_json, write_spec_json};

/// The request directory's tmpfs options: room for a request, not for data.
pub const REQUEST_TMPFS: &str = "size=4k,nr_inodes=8,mode=0755";

/// Host directory of the in-container request files.
pub const REQUEST_ROOT: &str = "/run/torpor/actors";
/// Where it appears inside the container.
pub const REQUEST_MOUNT: &str = "/run/torpor";
/// The host side of the request directory of shim `group`.
pub fn request_dir(group: &str) -> PathBuf {
    Path::new(REQUEST_ROOT).join(group)
}

/// CRIU options for the dumps of app containers (runc reads the file named
/// by the `org.criu.config` annotation): a connection still in the listen
/// backlog must not make a suspend fail; the client sees it reset, as if the
/// server had restarted.
const CRIU_CONFIG: &str = "skip-in-flight\n";

/// The app container's own CRIU configuration, beside its `config.json`:
/// [`CRIU_CONFIG`], [`CRIU_RECOVERY`] while a kept checkpoint is restored
/// into a new pod, and the options of the dump or restore under way
/// ([`operation_criu_config`]) after [`OPERATION_MARK`].
pub const OWN_CRIU_CONFIG: &str = "torpor-criu.conf";
const OPERATION_MARK: &str = "# this dump or restore:\n";

/// Adapts an app container's `config.json`: the request directory bind
/// mount, torpor's CRIU configuration, and the container's umask
/// ([`pin_umask`]).
pub fn adapt_spec(bundle: &Path, group: &str) -> Result<()> {
    adapt_spec_in(Path::new(REQUEST_ROOT), bundle, group)
}

/// [`adapt_spec`] with the request directories under `root` (and the CRIU
/// configuration beside it).
fn adapt_spec_in(root: &Path, bundle: &Path, group: &str) -> Result<()> {
    let dir = request_dir_in(root, group)?;
    std::fs::create_dir_all(&dir).io_context(|| format!("create {dir:?}"))?;
    mount_request_tmpfs(&dir)?;
    let criu_conf = bundle.join(OWN_CRIU_CONFIG);
    let path = bundle.join("config.json");
    let mut spec = read_spec_json(bundle)?;
    let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
        return Err(Error::InvalidArgument(format!("{path:?} has no mounts list")));
    };
    if !mounts.iter().any(|m| m["destination"] == REQUEST_MOUNT) {
        mounts.push(json!({
            "destination": REQUEST_MOUNT,
            "type": "bind",
            "source": dir,
            "options": ["rbind", "rw", "nosuid", "nodev", "noexec"],
        }));
    }
    if let Some(obj) = spec.as_object_mut() {
        let ann = obj.entry("annotations").or_insert_with(|| json!({}));
        if let Some(ann) = ann.as_object_mut() {
            let own = ann.entry("org.criu.config").or_insert_with(|| json!(criu_conf));
            // The user's own CRIU configuration is left alone.
            if own.as_str() == criu_conf.to_str() {
                write_criu_config(bundle, false, &[])?;
            }
        }
    }
    pin_umask(&mut spec);
    write_spec_json(bundle, &spec)
}

/// The request directory of `group` under `root`; a group that is not one
/// plain path component is refused (never a path outside the root).
fn request_dir_in(root: &Path, group: &str) -> Result<PathBuf> {
    let plain = !group.is_empty() && group != "." && group != ".." && !group.contains('/') && !group.contains('\0');
    if !plain {
        return Err(Error::InvalidArgument(format!("shim group {group:?} is not a plain name")));
    }
    Ok(root.join(group))
}

/// Whether `dir` is the root of a mount (it lies on another device than
/// its parent).
fn is_mount_root(dir: &Path) -> Result<bool> {
    let here = std::fs::symlink_metadata(dir).io_context(|| format!("stat {dir:?}"))?;
    let parent = dir.join("..");
    let up = std::fs::metadata(&parent).io_context(|| format!("stat {parent:?}"))?;
    Ok(here.dev() != up.dev())
}

/// Mounts the request tmpfs on `dir`, unless one is there already (every
/// app container of the pod shares the directory).
fn mount_request_tmpfs(dir: &Path) -> Result<()> {
    if is_mount_root(dir)? {
        return Ok(());
    }
    nix::mount::mount(
        Some("torpor-request"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(REQUEST_TMPFS),
    )
    .io_context(|| format!("mount a tmpfs ({REQUEST_TMPFS}) on the request directory {dir:?}"))
}

/// Unmounts and removes the request directory of shim `group` (when its
/// last container is gone, or after the shim died). Absent is fine.
pub fn remove_request_dir(group: &str) -> Result<()> {
    remove_request_dir_in(Path::new(REQUEST_ROOT), group)
}

fn remove_request_dir_in(root: &Path, group: &str) -> Result<()> {
    let dir = request_dir_in(root, group)?;
    // Every tmpfs stacked there (two creates racing could mount twice).
    loop {
        match nix::mount::umount2(&dir, MntFlags::MNT_DETACH) {
            Ok(()) => continue,
            // Not a mount point (any more), or not there at all.
            Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => break,
            Err(e) => return Err(e).io_context(|| format!("unmount the request directory {dir:?}")),
        }
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).io_context(|| format!("remove {dir:?}")),
        _ => Ok(()),
    }
}

/// CRIU options added for the restore of a checkpoint a dead shim kept into
/// a new pod: its established TCP connections were bound to the old pod's
/// IP, which the new pod does not have; they come back closed (the peers
/// saw them end with the old pod).
const CRIU_RECOVERY: &str = "tcp-close\n";

/// The container's own CRIU configuration while a kept checkpoint is
/// restored into it (`restoring`: with [`CRIU_RECOVERY`]) and after (the
/// container's later dumps keep their connections). A container with the
/// user's own CRIU configuration is left alone.
pub fn recovery_criu_config(bundle: &Path, restoring: bool) -> Result<()> {
    if !bundle.join(OWN_CRIU_CONFIG).exists() {
        return Ok(());
    }
    write_criu_config(bundle, restoring, &[])
}

/// The options of the dump or restore about to run (`external ...`,
/// `inherit-fd ...`) in the container's own CRIU configuration, replacing
/// the last operation's. Nothing is written when there were none and are
/// none. A container with the user's own configuration cannot take any:
/// an error naming it.
pub fn operation_criu_config(bundle: &Path, options: &[String]) -> Result<()> {
    let own = bundle.join(OWN_CRIU_CONFIG);
    let now = match std::fs::read_to_string(&own) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if options.is_empty() {
                return Ok(());
            }
            return Err(Error::FailedPrecondition(format!(
                "the container's CRIU configuration is the user's own (org.criu.config), not {own:?}: CRIU cannot be given {}",
                options.join(", ")
            )));
        }
        Err(e) => return Err(e).io_context(|| format!("read {own:?}")),
    };
    if options.is_empty() && !now.contains(OPERATION_MARK) {
        return Ok(());
    }
    let recovery = now.lines().any(|l| l == CRIU_RECOVERY.trim_end());
    write_criu_config(bundle, recovery, options)
}

/// Writes the container's own CRIU configuration (atomically: CRIU may be
/// reading the last one).
fn write_criu_config(bundle: &Path, recovery: bool, options: &[String]) -> Result<()> {
    let own = bundle.join(OWN_CRIU_CONFIG);
    let mut text = String::from(CRIU_CONFIG);
    if recovery {
        text.push_str(CRIU_RECOVERY);
    }
    if !options.is_empty() {
        text.push_str(OPERATION_MARK);
        for o in options {
            if o.contains('\n') {
                return Err(Error::InvalidArgument(format!("CRIU option {o:?} spans lines")));
            }
            text.push_str(o);
            text.push('\n');
        }
    }
    let tmp = bundle.join(format!(".{OWN_CRIU_CONFIG}.tmp"));
    std::fs::write(&tmp, text).io_context(|| format!("write {tmp:?}"))?;
    std::fs::rename(&tmp, &own).io_context(|| format!("rename {tmp:?} to {own:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_mount_is_added_once() {
        let b = tempfile::tempdir().unwrap();
        std::fs::write(
            b.path().join("config.json"),
            r#"{"ociVersion":"1.2.0","mounts":[{"destination":"/proc","type":"proc","source":"proc"}],"x":1}"#,
        )
        .unwrap();
        let run = tempfile::tempdir().unwrap();
        let root = run.path().join("actors");
        adapt_spec_in(&root, b.path(), "pod").unwrap();
        adapt_spec_in(&root, b.path(), "pod").unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(b.path().join("config.json")).unwrap()).unwrap();
        let mounts = v["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[1]["destination"], REQUEST_MOUNT);
        assert_eq!(v["x"], 1);
        let own = b.path().join(OWN_CRIU_CONFIG);
        assert_eq!(v["annotations"]["org.criu.config"], own.to_str().unwrap());
        assert_eq!(mounts[1]["source"], root.join("pod").to_str().unwrap());
        assert_eq!(std::fs::read_to_string(&own).unwrap(), CRIU_CONFIG);
        remove_request_dir_in(&root, "pod").unwrap();
    }

    /// The operation's options replace the last operation's, keep the
    /// recovery option while it is on, and go with an empty set.
    #[test]
    fn operation_options_replace_the_last_and_keep_recovery() {
        let b = tempfile::tempdir().unwrap();
        let own = b.path().join(OWN_CRIU_CONFIG);
        let read = || std::fs::read_to_string(&own).unwrap();
        write_criu_config(b.path(), false, &[]).unwrap();
        operation_criu_config(b.path(), &["external unix[7]".into()]).unwrap();
        assert_eq!(read(), format!("{CRIU_CONFIG}{OPERATION_MARK}external unix[7]\n"));
        recovery_criu_config(b.path(), true).unwrap();
        assert_eq!(read(), format!("{CRIU_CONFIG}{CRIU_RECOVERY}"));
        operation_criu_config(b.path(), &["inherit-fd fd[100]:socket:[7]".into()]).unwrap();
        assert_eq!(read(), format!("{CRIU_CONFIG}{CRIU_RECOVERY}{OPERATION_MARK}inherit-fd fd[100]:socket:[7]\n"));
        operation_criu_config(b.path(), &[]).unwrap();
        assert_eq!(read(), format!("{CRIU_CONFIG}{CRIU_RECOVERY}"));
        recovery_criu_config(b.path(), false).unwrap();
        assert_eq!(read(), CRIU_CONFIG);
        assert!(operation_criu_config(b.path(), &["external a\nb".into()]).is_err());
        // The user's own configuration: nothing to add is fine, options are refused.
        std::fs::remove_file(&own).unwrap();
        operation_criu_config(b.path(), &[]).unwrap();
        let e = operation_criu_config(b.path(), &["external unix[7]".into()]).unwrap_err();
        assert!(e.to_string().contains("the user's own"), "{e}");
        recovery_criu_config(b.path(), true).unwrap();
        assert!(!own.exists());
    }

    fn mounts_at(dir: &Path) -> usize {
        let dir = dir.to_str().unwrap();
        std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().filter(|l| l.split(' ').nth(4) == Some(dir)).count()
    }

    /// The request directory is a tiny tmpfs (once, the container could
    /// fill the host's /run through it), mounted once for the pod and
    /// gone, unmounted, after remove_request_dir.
    #[test]
    fn the_request_directory_is_a_tiny_tmpfs_removed_unmounted() {
        let b = tempfile::tempdir().unwrap();
        std::fs::write(b.path().join("config.json"), r#"{"mounts":[]}"#).unwrap();
        let run = tempfile::tempdir().unwrap();
        let root = run.path().join("actors");
        adapt_spec_in(&root, b.path(), "pod").unwrap();
        adapt_spec_in(&root, b.path(), "pod").unwrap();
        let dir = root.join("pod");
        assert_eq!(mounts_at(&dir), 1);
        let fs = nix::sys::statfs::statfs(&dir).unwrap();
        assert_eq!(fs.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
        let e = std::fs::write(dir.join("request"), vec![b'x'; 64 * 1024]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        let filled = (0..16).filter(|i| std::fs::write(dir.join(format!("f{i}")), b"").is_ok()).count();
        assert!(filled < 8, "{filled} files made");
        remove_request_dir_in(&root, "pod").unwrap();
        assert_eq!(mounts_at(&dir), 0);
        assert!(!dir.exists());
        remove_request_dir_in(&root, "pod").unwrap();
        for bad in ["", ".", "..", "a/b"] {
            assert!(adapt_spec_in(&root, b.path(), bad).is_err(), "{bad:?}");
            assert!(remove_request_dir_in(&root, bad).is_err(), "{bad:?}");
        }
    }
}
