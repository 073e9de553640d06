//! The container's own tmpfs mounts (runc's `/dev`, the cgroup v1
//! `/sys/fs/cgroup`, a spec's `tmpfs` mounts), carried beside CRIU's
//! images by torpor rather than by CRIU.
//!
//! CRIU dumps such a mount's files with `tar | gzip` and restores them with
//! `gzip -d | tar`: two process trees for each mount on every restore,
//! about 8 ms each on the restore path of a suspended pod. Instead, the
//! suspend archives each of them itself ([`capture`], while the container
//! is frozen, with [`rootfs::capture_mount`]) into the image directory and
//! tells CRIU the mount is external (`external mnt[/dev]:torpor-tmpfs-0`).
//! The restore ([`prepare`]) mounts a fresh tmpfs with the same options on
//! the shim's side, unpacks the archive into it (in process, every path
//! resolved inside it, see [`rootfs::apply`]), and hands it to CRIU
//! (`external mnt[torpor-tmpfs-0]:<that directory>`), which bind-mounts it
//! in the container's mount namespace. Once CRIU is done, the shim's
//! mount is detached ([`Prepared`] drops); the container's stays.
//!
//! Only a tmpfs that runc made for the container alone is taken: at a
//! mount point where the spec asks for a `tmpfs` (or, on cgroup v1, its
//! `cgroup`), mounted at its root (`/`), once, and not a mount of the
//! shim's own namespace. A pod's `/dev/shm`, a memory `emptyDir` or a
//! kubelet's token volume are binds of host mounts, which CRIU binds from
//! the host already. A mount whose options torpor does not know is left to
//! CRIU.
//! The manifest ([`MANIFEST`]) comes from the snapshot: its options are
//! checked against the same list before they reach `mount(2)`.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::error::{Error, IoContext, Result};
use crate::system::mounts::{self, MountInfo};
use crate::system::rootfs;

/// The manifest's file name in a container's image directory.
pub const MANIFEST: &str = "torpor-tmpfs.json";

/// At most this many mounts are carried (more are left to CRIU).
const MAX_MOUNTS: usize = 16;

/// The tmpfs options a carried mount may have (`size=64m`, `mode=755`...).
const DATA_OPTIONS: &[&str] = &["size", "nr_blocks", "nr_inodes", "mode", "uid", "gid", "huge"];
const DATA_FLAGS: &[&str] = &["inode64", "inode32", "noswap"];

/// One carried mount, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kept {
    /// Where it is mounted in the container (`/dev`).
    pub mountpoint: String,
    /// Its tmpfs options (`size=65536k,mode=755`), as `mount(2)` data.
    pub data: String,
    /// Its per-mount flags (`ro`, `nosuid`, `nodev`, `noexec`, and the atime
    /// one: `relatime`, `noatime` or `strictatime`).
    pub flags: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    mounts: Vec<Kept>,
}

/// CRIU's name of the `i`th carried mount.
fn key(i: usize) -> String {
    format!("torpor-tmpfs-{i}")
}

fn archive_name(i: usize) -> String {
    format!("tmpfs-{i}.tar")
}

/// The carried mounts among the mounts of a container (`theirs`, its
/// init's mountinfo) that the shim's namespace (`ours`) does not have, at
/// the mount points where its spec has runc make a fresh tmpfs
/// (`fresh`: the destinations of its `tmpfs` mounts, and of its `cgroup`
/// mount on cgroup v1). A volume a kubelet mounted as a tmpfs on the host
/// (a service account token) is a bind in the spec: never taken, even
/// when the shim does not see the kubelet's mounts.
pub fn own_mounts(theirs: &[MountInfo], ours: &[MountInfo], fresh: &[String]) -> Vec<Kept> {
    let mut kept = Vec::new();
    for m in theirs {
        if m.fstype != "tmpfs" || m.root != "/" || !fresh.contains(&m.mount_point) {
            continue;
        }
        let shared = ours.iter().any(|o| o.dev == m.dev) || theirs.iter().filter(|o| o.dev == m.dev).count() > 1;
        if shared {
            continue;
        }
        let flags = match mount_flags(&m.mount_options) {
            Ok(f) => f,
            Err(why) => {
                debug!(mountpoint = m.mount_point.as_str(), "tmpfs left to CRIU: {why}");
                continue;
            }
        };
        let data: Vec<&str> = m.super_options.split(',').filter(|o| *o != "rw" && *o != "ro").collect();
        let k = Kept { mountpoint: m.mount_point.clone(), data: data.join(","), flags };
        if let Err(why) = check(&k) {
            debug!(mountpoint = m.mount_point.as_str(), "tmpfs left to CRIU: {why}");
            continue;
        }
        kept.push(k);
        if kept.len() == MAX_MOUNTS {
            break;
        }
    }
    kept
}

/// The per-mount flags of a mountinfo entry's mount options, named as the
/// manifest keeps them.
fn mount_flags(options: &str) -> std::result::Result<Vec<String>, String> {
    let mut flags = Vec::new();
    let mut atime = "strictatime";
    for o in options.split(',') {
        match o {
            "rw" => {}
            "relatime" | "noatime" => atime = o,
            // mountinfo shows strict atime as no atime option at all.
            o if o != "strictatime" && flag(o).is_some() => flags.push(o.to_string()),
            other => return Err(format!("mount option {other:?}")),
        }
    }
    flags.push(atime.to_string());
    Ok(flags)
}

/// What makes a manifest entry unfit: a mount point CRIU's option syntax
/// or the container's root cannot hold, or options outside the known ones.
fn check(k: &Kept) -> std::result::Result<(), String> {
    let p = Path::new(&k.mountpoint);
    let plain = k.mountpoint.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'[' | b']' | b':' | b',' | b'\\'));
    if !p.is_absolute()
        || k.mountpoint == "/"
        || !plain
        || p.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir))
    {
        return Err(format!("mount point {:?} is not a plain absolute path", k.mountpoint));
    }
    for o in k.data.split(',').filter(|o| !o.is_empty()) {
        let known = match o.split_once('=') {
            Some((name, value)) => {
                DATA_OPTIONS.contains(&name)
                    && !value.is_empty()
                    && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'%')
            }
            None => DATA_FLAGS.contains(&o),
        };
        if !known {
            return Err(format!("tmpfs option {o:?}"));
        }
    }
    let atimes = k.flags.iter().filter(|f| matches!(f.as_str(), "relatime" | "noatime" | "strictatime")).count();
    if atimes != 1 || k.flags.iter().any(|f| flag(f).is_none()) {
        return Err(format!("mount flags {:?}", k.flags));
    }
    Ok(())
}

fn flag(name: &str) -> Option<MsFlags> {
    Some(match name {
        "ro" => MsFlags::MS_RDONLY,
        "nosuid" => MsFlags::MS_NOSUID,
        "nodev" => MsFlags::MS_NODEV,
        "noexec" => MsFlags::MS_NOEXEC,
        "nodiratime" => MsFlags::MS_NODIRATIME,
        "relatime" => MsFlags::MS_RELATIME,
        "noatime" => MsFlags::MS_NOATIME,
        "strictatime" => MsFlags::MS_STRICTATIME,
        _ => return None,
    })
}

/// Archives the own tmpfs mounts of the container whose init is `pid`
/// (frozen) into `image` and writes the manifest; returns CRIU's
/// `external` resources for the dump (`mnt[/dev]:torpor-tmpfs-0`).
/// `fresh`: see [`own_mounts`].
pub fn capture(pid: i32, image: &Path, fresh: &[String]) -> Result<Vec<String>> {
    let theirs = mounts::mountinfo(&format!("/proc/{pid}/mountinfo"))?;
    let ours = mounts::mountinfo("/proc/self/mountinfo")?;
    let kept = own_mounts(&theirs, &ours, fresh);
    let mut external = Vec::with_capacity(kept.len());
    for (i, k) in kept.iter().enumerate() {
        let root = PathBuf::from(format!("/proc/{pid}/root{}", k.mountpoint));
        rootfs::capture_mount(&root, &image.join(archive_name(i)))?;
        external.push(format!("mnt[{}]:{}", k.mountpoint, key(i)));
    }
    let path = image.join(MANIFEST);
    let manifest =
        serde_json::to_vec(&Manifest { mounts: kept }).map_err(|source| Error::Json { context: format!("encode {path:?}"), source })?;
    std::fs::write(&path, manifest).io_context(|| format!("write {path:?}"))?;
    Ok(external)
}

/// The carried mounts of a restore, mounted under its work directory
/// until CRIU has bound them; dropping it detaches them.
#[derive(Debug, Default)]
pub struct Prepared {
    dirs: Vec<PathBuf>,
    /// CRIU's `external` resources for the restore.
    pub external: Vec<String>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        for d in &self.dirs {
            if let Err(e) = umount2(d, MntFlags::MNT_DETACH) {
                warn!(dir = %d.display(), "detach the tmpfs handed to CRIU: {e}");
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Mounts and fills the tmpfs mounts that `image`'s manifest lists (none
/// without a manifest: an image of CRIU's own) under `work`.
pub fn prepare(image: &Path, work: &Path) -> Result<Prepared> {
    let path = image.join(MANIFEST);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Prepared::default()),
        Err(e) => return Err(e).io_context(|| format!("read {path:?}")),
    };
    let corrupt = |why: String| Error::Corrupt(format!("{path:?}: {why}"));
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
    if manifest.mounts.len() > MAX_MOUNTS {
        return Err(corrupt(format!("{} mounts, at most {MAX_MOUNTS} are carried", manifest.mounts.len())));
    }
    for k in &manifest.mounts {
        check(k).map_err(|why| corrupt(format!("mount {:?}: {why}", k.mountpoint)))?;
    }
    // What an earlier attempt left (a shim killed during its restore).
    mounts::detach_under(work);
    let mut prepared = Prepared::default();
    for (i, k) in manifest.mounts.iter().enumerate() {
        let dir = work.join(format!("tmpfs-{i}"));
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).io_context(|| format!("remove the stale {dir:?}")),
            _ => {}
        }
        std::fs::create_dir(&dir).io_context(|| format!("create {dir:?}"))?;
        let flags = k.flags.iter().filter_map(|f| flag(f)).fold(MsFlags::empty(), |a, f| a | f);
        let at = |what: &str| format!("{what} tmpfs {dir:?} for {} ({})", k.mountpoint, k.data);
        if let Err(e) = mount(Some("tmpfs"), &dir, Some("tmpfs"), flags - MsFlags::MS_RDONLY, Some(k.data.as_str())) {
            let _ = std::fs::remove_dir(&dir);
            return Err(e).io_context(|| at("mount"));
        }
        prepared.dirs.push(dir.clone());
        mount(None::<&str>, &dir, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>).io_context(|| at("make private"))?;
        rootfs::apply(&image.join(archive_name(i)), &dir)?;
        if flags.contains(MsFlags::MS_RDONLY) {
            mount(None::<&str>, &dir, None::<&str>, MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags, None::<&str>)
                .io_context(|| at("make read-only"))?;
        }
        prepared.external.push(format!("mnt[{}]:{}", key(i), dir.display()));
    }
    Ok(prepared)
}

#[cfg(test)]
mod tests;
