//! "Never running twice" on one node: a shim runs an actor only while it
//! holds the actor's claim, an exclusive `flock` on
//! `/run/torpor/actors.lock/<escaped actor id>` (directory 0700). A second
//! shim that creates a container of the same actor while the claim is held
//! is refused, naming the holder; the kernel drops the lock when a shim
//! dies, so a crash never leaves a stale claim (the cleanup after the
//! death removes its file: [`remove_stale`]).
//!
//! Node-local: across nodes, the actor's lease in the object tier (taken
//! by [`crate::lifecycle::Actor::init`] right after the claim, through the
//! node's snapshot store) keeps it from running twice. Everything about the
//! claim is in this module.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, IoContext, Result};

/// Directory of the claim files.
pub const CLAIM_DIR: &str = "/run/torpor/actors.lock";

/// The node's claim directory: `$TORPOR_CLAIM_DIR`, else [`CLAIM_DIR`].
pub fn claim_dir() -> PathBuf {
    std::env::var_os("TORPOR_CLAIM_DIR").map(PathBuf::from).unwrap_or_else(|| CLAIM_DIR.into())
}

/// The claim file of `actor`: actor ids are `[a-z0-9._-]` with at most one
/// `/`, which is written `%2f` (a single path component).
fn claim_path(dir: &Path, actor: &str) -> PathBuf {
    dir.join(actor.replace('%', "%25").replace('/', "%2f"))
}

/// A held claim; dropping it releases the actor.
#[derive(Debug)]
pub struct Claim {
    path: PathBuf,
    lock: Option<Flock<File>>,
}

impl Claim {
    /// Claims `actor` for shim `shim` (this process), in claim directory
    /// `dir` ([`claim_dir`]). Refused with `FailedPrecondition` naming the
    /// holder if another process holds it.
    pub fn take_in(dir: &Path, actor: &str, shim: &str) -> Result<Claim> {
        std::fs::create_dir_all(dir).io_context(|| format!("create {dir:?}"))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).io_context(|| format!("chmod 0700 {dir:?}"))?;
        let path = claim_path(dir, actor);
        // The file can be unlinked by its holder between our open and our
        // lock: then the lock is on a file nobody else finds; retry.
        for _ in 0..10 {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .io_context(|| format!("open {path:?}"))?;
            let mut lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
                    let mut holder = String::new();
                    let _ = f.read_to_string(&mut holder);
                    let holder = holder.trim();
                    return Err(Error::FailedPrecondition(format!(
                        "actor {actor} already runs on this node ({}): an actor runs at most once; \
                         remove the other pod first",
                        if holder.is_empty() { "held by another shim".to_string() } else { holder.to_string() }
                    )));
                }
                Err((_, e)) => return Err(e).io_context(|| format!("flock {path:?}")),
            };
            let same = match (lock.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if !same {
                continue;
            }
            let who = format!("claimed by shim {shim} (pid {})", std::process::id());
            lock.set_len(0).io_context(|| format!("truncate {path:?}"))?;
            lock.rewind().io_context(|| format!("seek {path:?}"))?;
            lock.write_all(who.as_bytes()).io_context(|| format!("write {path:?}"))?;
            return Ok(Claim { path, lock: Some(lock) });
        }
        Err(Error::FailedPrecondition(format!("actor {actor}: the claim file {path:?} keeps changing")))
    }
}

/// Removes the claim file of `actor` that a dead shim left (the kernel
/// dropped its lock, the file stays): taken and released at once. One a
/// live shim holds is left alone.
pub fn remove_stale(actor: &str) {
    remove_stale_in(&claim_dir(), actor);
}

fn remove_stale_in(dir: &Path, actor: &str) {
    if claim_path(dir, actor).exists() {
        drop(Claim::take_in(dir, actor, "cleanup after a shim death"));
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Unlinked while still locked: whoever opened the old file finds
        // it gone after locking it, and retries on a new one.
        let _ = std::fs::remove_file(&self.path);
        drop(self.lock.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("locks");
        let a = Claim::take_in(&d, "ns/pod", "shim-a").unwrap();
        assert!(d.join("ns%2fpod").is_file());
        // flock is per open file: a second open in this process conflicts too.
        let e = Claim::take_in(&d, "ns/pod", "shim-b").unwrap_err().to_string();
        assert!(e.contains("ns/pod") && e.contains("shim-a") && e.contains(&std::process::id().to_string()), "{e}");
        let other = Claim::take_in(&d, "ns/other", "shim-b").unwrap();
        drop(a);
        let b = Claim::take_in(&d, "ns/pod", "shim-b").unwrap();
        drop((b, other));
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "released claims leave no file");
    }

    #[test]
    fn a_dead_holders_claim_file_is_removed_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("locks");
        std::fs::create_dir_all(&d).unwrap();
        // a dead shim's: the file, no lock
        std::fs::write(d.join("ns%2fdead"), "claimed by shim s1 (pid 1)").unwrap();
        let live = Claim::take_in(&d, "ns/live", "shim-live").unwrap();
        for actor in ["ns/dead", "ns/live", "ns/never"] {
            remove_stale_in(&d, actor);
        }
        assert!(!d.join("ns%2fdead").exists(), "the dead shim's claim file is removed");
        assert!(d.join("ns%2flive").exists(), "a held claim stays");
        assert!(Claim::take_in(&d, "ns/live", "shim-b").is_err(), "and stays held");
        drop(live);
    }
}
