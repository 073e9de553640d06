//! CRIU's cache of what the kernel supports (`/run/criu.kdat`), warmed when
//! the node daemon starts, before any suspend or resume.
//!
//! Without the cache every CRIU run probes the kernel first: about 30 ms of
//! each restore, and most of the start of a resume's lazy-pages daemon
//! (60 ms → 10 ms measured). CRIU writes the cache itself, but only on a
//! tmpfs (`/run` of a systemd host), so that a reboot into another kernel
//! never finds a stale one. Where `/run` is a tmpfs, one `criu check` here
//! writes it. Where it is not, the cache is made by a `criu check` in a
//! mount namespace of its own with a tmpfs on `/run`, and put in place
//! (temp file, rename); the daemon makes it again at each start, so after
//! a reboot it describes the running kernel. CRIU checks the file's magic
//! and size at every load and rebuilds a stale one.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};

/// Where CRIU (as root) reads its cache.
pub const KDAT: &str = "/run/criu.kdat";
/// `criu check` takes well under a second.
const DEADLINE: Duration = Duration::from_secs(30);
/// A kdat file is about 1 KiB; anything larger is not one.
const MAX_KDAT: usize = 64 * 1024;

/// Warms the cache, logging what it did; a failure is a warning (CRIU
/// then probes at every run, as before).
pub async fn warm() {
    match warm_at(Path::new("/run")).await {
        Ok(how) => info!(path = KDAT, "CRIU's kernel cache is warm ({how})"),
        Err(e) => warn!(path = KDAT, "CRIU's kernel cache could not be warmed (each CRIU run probes the kernel): {e}"),
    }
}

async fn warm_at(run: &Path) -> Result<&'static str, String> {
    let fs = nix::sys::statfs::statfs(run).map_err(|e| format!("statfs {run:?}: {e}"))?;
    if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
        let out = run_with_deadline(tokio::process::Command::new("criu").arg("check")).await?;
        if !Path::new(KDAT).exists() {
            return Err(format!("`criu check` wrote no cache (exit {:?})", out.status.code()));
        }
        return Ok("written by criu check");
    }
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", "criu check >/dev/null 2>&1; exec cat /run/criu.kdat"]);
    // SAFETY: between fork and exec only async-signal-safe system calls
    // (unshare, mount) with static C strings: no allocation.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let none: *const libc::c_void = std::ptr::null();
            if libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, none) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let opts = c"size=1m,mode=0755";
            if libc::mount(
                c"torpor-criu-kdat".as_ptr(),
                c"/run".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = run_with_deadline(&mut tokio::process::Command::from(cmd)).await?;
    let kdat = out.stdout;
    if !out.status.success() || kdat.is_empty() || kdat.len() > MAX_KDAT {
        return Err(format!(
            "`criu check` in a private /run wrote no cache (exit {:?}, {} bytes): {}",
            out.status.code(),
            kdat.len(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // Root only, through a temp file, fsynced, renamed.
    torpor_store::write_atomic(&run.join("criu.kdat"), &kdat).map_err(|e| e.to_string())?;
    Ok("made in a private /run: this /run is not a tmpfs")
}

async fn run_with_deadline(cmd: &mut tokio::process::Command) -> Result<std::process::Output, String> {
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    match tokio::time::timeout(DEADLINE, cmd.output()).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("run criu: {e}")),
        Err(_) => Err(format!("criu check did not finish within {DEADLINE:?}")),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    /// The cache replaces the old one, readable by root alone, and leaves
    /// no temp file.
    #[test]
    fn the_cache_is_put_in_place_for_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("criu.kdat");
        std::fs::write(&path, b"old").unwrap();
        torpor_store::write_atomic(&path, b"new kdat").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new kdat");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
    }
}
