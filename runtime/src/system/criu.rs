//! The CRIU torpor depends on: present, and new enough. Checked before the
//! first checkpoint or restore of a shim, so a missing or old CRIU is named
//! plainly instead of surfacing as a broken RPC pipe inside runc.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Oldest CRIU that works on the kernels torpor runs on (older releases
/// cannot dump TCP sockets on Linux ≥ 6.16, or fail on the vDSO).
pub const MIN_VERSION: (u32, u32) = (4, 2);

/// `criu --version` answers at once; past this it is killed.
const VERSION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Parses `criu --version` output ("Version: 4.2.1" on the first line).
pub fn parse_version(out: &str) -> Option<(u32, u32, u32)> {
    let v = out.lines().find_map(|l| l.trim().strip_prefix("Version:"))?.trim();
    let mut it = v.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
    let major = it.next()?.parse().ok()?;
    let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let patch = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// The CRIU found by the version check: the `criu` runc would run (the
/// first in PATH), as an absolute path, with its version and the identity of
/// the file (so a CRIU replaced under a running shim is noticed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub bin: PathBuf,
    pub version: (u32, u32, u32),
    pub id: String,
}

/// The check passed in this process: CRIU is not replaced by an older one
/// under a running shim, and each check is a process spawn on the suspend
/// and resume paths.
static CHECKED: OnceLock<Installed> = OnceLock::new();

/// Fails unless the `criu` runc will run (from PATH) is at least
/// [`MIN_VERSION`] (checked once per process); returns what was found. Runs
/// through the reaper (the shim reaps all its children).
pub async fn check() -> Result<&'static Installed> {
    if let Some(i) = CHECKED.get() {
        return Ok(i);
    }
    let found = check_version().await?;
    Ok(CHECKED.get_or_init(|| found))
}

/// The first executable `criu` in `path` (a PATH value; the shim's own
/// never holds the launcher's directory, only runc's does).
pub fn find_in_path(path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("criu"))
        .find(|c| std::fs::metadata(c).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false))
}

/// A file's identity: device, inode, size and modification time.
pub fn file_id(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!("{}:{}:{}:{}.{}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

async fn check_version() -> Result<Installed> {
    let not_found =
        |why: String| Error::FailedPrecondition(format!("CRIU not found: {why}; torpor needs CRIU >= {}.{}", MIN_VERSION.0, MIN_VERSION.1));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let bin = find_in_path(&path).ok_or_else(|| not_found(format!("no executable `criu` in PATH ({})", path.to_string_lossy())))?;
    let id = file_id(&bin).ok_or_else(|| not_found(format!("{} cannot be read", bin.display())))?;
    let mut cmd = Command::new(&bin);
    cmd.arg("--version");
    let out = crate::system::reaper::output(cmd, VERSION_DEADLINE)
        .await
        .map_err(|e| not_found(format!("running `{} --version` failed ({e})", bin.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = parse_version(&text) else {
        return Err(Error::FailedPrecondition(format!(
            "cannot tell the CRIU version from `{} --version`: {:?}",
            bin.display(),
            text.trim()
        )));
    };
    if (version.0, version.1) < MIN_VERSION {
        return Err(Error::FailedPrecondition(format!(
            "CRIU {}.{}.{} ({}) is too old: torpor needs CRIU >= {}.{}",
            version.0,
            version.1,
            version.2,
            bin.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        )));
    }
    Ok(Installed { bin, version, id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("Version: 4.2.1\n"), Some((4, 2, 1)));
        assert_eq!(parse_version("Version: 3.17.1\nGitID: x\n"), Some((3, 17, 1)));
        assert_eq!(parse_version("Version: 4.2\n"), Some((4, 2, 0)));
        assert_eq!(parse_version("nonsense"), None);
        assert!((3, 17) < MIN_VERSION && (4, 2) >= MIN_VERSION && (5, 0) >= MIN_VERSION);
    }

    #[test]
    fn criu_is_looked_up_in_path() {
        use std::os::unix::fs::PermissionsExt;
        let t = std::env::temp_dir().join(format!("torpor-criu-path-{}", std::process::id()));
        let (real, plain) = (t.join("real"), t.join("plain"));
        for d in [&real, &plain] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(real.join("criu"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(real.join("criu"), std::fs::Permissions::from_mode(0o755)).unwrap();
        // Not executable: skipped; a relative entry: skipped.
        std::fs::write(plain.join("criu"), "").unwrap();
        let path = std::env::join_paths([plain.as_path(), Path::new("relative"), real.as_path()]).unwrap();
        assert_eq!(find_in_path(&path), Some(real.join("criu")));
        assert_eq!(find_in_path(&std::env::join_paths([&plain]).unwrap()), None);
        let id = file_id(&real.join("criu")).unwrap();
        assert_eq!(file_id(&real.join("criu")), Some(id.clone()));
        std::fs::write(real.join("criu"), "#!/bin/sh\n# another\n").unwrap();
        assert_ne!(file_id(&real.join("criu")), Some(id));
        std::fs::remove_dir_all(&t).unwrap();
    }
}
