//! The CRIU torpor depends on: present, and new enough. Checked before the
//! first checkpoint or restore of a shim, so a missing or old CRIU is named
//! plainly instead of surfacing as a broken RPC pipe inside runc.

use std::process::Command;

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

/// A version check passed in this process: CRIU is not replaced by an
/// older one under a running shim, and each check is a process spawn on the
/// suspend and resume paths.
static CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Fails unless the `criu` runc will run (from PATH) is at least [`MIN_VERSION`]
/// (checked once per process). Runs through the reaper (the shim reaps all
/// its children).
pub async fn check() -> Result<()> {
    use std::sync::atomic::Ordering;
    if CHECKED.load(Ordering::Relaxed) {
        return Ok(());
    }
    check_version().await?;
    CHECKED.store(true, Ordering::Relaxed);
    Ok(())
}

async fn check_version() -> Result<()> {
    let mut cmd = Command::new("criu");
    cmd.arg("--version");
    let out = crate::system::reaper::output(cmd, VERSION_DEADLINE).await.map_err(|e| {
        Error::FailedPrecondition(format!(
            "CRIU not found: running `criu --version` failed ({e}); torpor needs CRIU >= {}.{}",
            MIN_VERSION.0, MIN_VERSION.1
        ))
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(v) = parse_version(&text) else {
        return Err(Error::FailedPrecondition(format!(
            "cannot tell the CRIU version from `criu --version`: {:?}",
            text.trim()
        )));
    };
    if (v.0, v.1) < MIN_VERSION {
        return Err(Error::FailedPrecondition(format!(
            "CRIU {}.{}.{} is too old: torpor needs CRIU >= {}.{}",
            v.0, v.1, v.2, MIN_VERSION.0, MIN_VERSION.1
        )));
    }
    Ok(())
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
}
