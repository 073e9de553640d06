//! Mounts: the mountinfo of a process ([`mountinfo`]), and the mounts
//! left below one of the runtime's own directories.
//!
//! CRIU mounts its cgroup yard (`.criu.cgyard.*`, a tmpfs with a mount of
//! each hierarchy) inside its work directory during a restore, and takes it
//! down at the end; a CRIU that was killed in between (a restore stopped
//! at its deadline, a failed stream, the cleanup after a dead shim) leaves
//! it mounted. Before such a directory is removed, [`detach_under`] takes
//! down whatever is mounted below it, so neither the mounts nor the
//! directory outlive the actor.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

/// Lazily unmounts (`MNT_DETACH`) every mount point strictly below `dir`
/// in this process's mount namespace, deepest first. Returns how many went.
pub fn detach_under(dir: &Path) -> usize {
    let Ok(info) = mountinfo("/proc/self/mountinfo") else { return 0 };
    let mut points: Vec<PathBuf> =
        info.into_iter().map(|m| PathBuf::from(m.mount_point)).filter(|p| p.starts_with(dir) && p != dir).collect();
    // Deepest first. A path listed twice is two mounts stacked on it: each
    // detach takes the top one.
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let mut n = 0;
    for p in &points {
        match nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => n += 1,
            // an upper mount's detach took it along
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => warn!(mount = %p.display(), "detach a mount left below {}: {e}", dir.display()),
        }
    }
    if n > 0 {
        info!(dir = %dir.display(), mounts = n, "detached mounts left below the directory (a killed CRIU's cgroup yard)");
    }
    n
}

/// One line of a `/proc/<pid>/mountinfo` (proc(5)), its paths unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// The device of the mounted file system, `major:minor`.
    pub dev: String,
    /// The directory of the file system mounted (`/` for all of it).
    pub root: String,
    /// Where it is mounted, in the reader's root.
    pub mount_point: String,
    /// The per-mount options (`rw,nosuid,relatime`).
    pub mount_options: String,
    pub fstype: String,
    /// The file system's own options (`rw,size=65536k,mode=755`).
    pub super_options: String,
}

/// The mounts listed in `text` (a mountinfo); lines it cannot read are
/// skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|l| {
            let (front, back) = l.split_once(" - ")?;
            let f: Vec<&str> = front.split(' ').collect();
            let b: Vec<&str> = back.split(' ').collect();
            if f.len() < 6 || b.len() < 3 {
                return None;
            }
            Some(MountInfo {
                dev: f[2].to_string(),
                root: unescape(f[3]),
                mount_point: unescape(f[4]),
                mount_options: f[5].to_string(),
                fstype: b[0].to_string(),
                super_options: b[2].to_string(),
            })
        })
        .collect()
}

/// The mounts of the mountinfo file at `path`.
pub fn mountinfo(path: &str) -> crate::error::Result<Vec<MountInfo>> {
    use crate::error::IoContext;
    Ok(parse_mountinfo(&std::fs::read_to_string(path).io_context(|| format!("read {path}"))?))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)))
            .then(|| b[i + 1..i + 4].iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
            .and_then(|v| u8::try_from(v).ok());
        if let Some(c) = octal {
            out.push(c);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/end\"), r"/end\");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape(r"/big\777"), r"/big\777", "not a byte: kept as it is");
    }

    /// As root (the tests' user): a tmpfs with another inside it, as a
    /// killed CRIU leaves its cgroup yard, goes; the directory can go then.
    #[test]
    fn nested_mounts_below_a_directory_are_detached() {
        use nix::mount::{mount, MsFlags};
        let tmp = tempfile::tempdir().expect("tempdir");
        // a failing assertion leaves no mount behind either
        struct Detach(PathBuf);
        impl Drop for Detach {
            fn drop(&mut self) {
                detach_under(&self.0);
            }
        }
        let _guard = Detach(tmp.path().to_path_buf());
        let yard = tmp.path().join("work/gen-1/c.lazy/.criu.cgyard.test");
        std::fs::create_dir_all(&yard).expect("mkdir");
        mount(Some("none"), &yard, Some("tmpfs"), MsFlags::empty(), Some("size=64k")).expect("mount the yard (tests run as root)");
        let inner = yard.join("memory");
        std::fs::create_dir_all(&inner).expect("mkdir inner");
        mount(Some("none"), &inner, Some("tmpfs"), MsFlags::empty(), Some("size=64k")).expect("mount inside the yard");
        let beside = tempfile::tempdir().expect("tempdir");
        assert_eq!(detach_under(tmp.path()), 2);
        let left = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!left.contains(&*tmp.path().to_string_lossy()), "no mount left below {:?}", tmp.path());
        std::fs::remove_dir_all(tmp.path().join("work")).expect("the directory can go now");
        assert_eq!(detach_under(beside.path()), 0);
    }
}
