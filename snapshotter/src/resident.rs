//! The restore path's programs, kept in memory.
//!
//! Every resume runs `criu` (the lazy-pages daemon, runc's version check,
//! the restore) and `runc`. Once their pages are evicted (memory pressure,
//! a dropped page cache), the next resume reads them and their shared
//! libraries from disk again: on the bench machine that was about 65 ms of
//! a 256 MiB resume after `drop_caches` (p50 203 → 137 ms with them
//! locked). The daemon lives as long as the node serves actors, so it maps
//! each program of `resident_programs` (docs/CONFIG.md) and every library
//! `ldd` names for it, and locks them (`mlock`): about 24 MiB for CRIU 4.2
//! and runc 1.1 on Debian, charged to the daemon.
//!
//! Nothing here stops the daemon: a program that is not found or a file
//! that cannot be locked is a warning (the resumes are then as fast as the
//! page cache makes them). A program replaced on disk later (an upgrade)
//! is not the one locked; the daemon's restart locks the new one.

use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::Duration;

use nix::sys::mman::{mlock, mmap, munmap, MapFlags, ProtFlags};
use tracing::{info, warn};

/// The programs locked unless the config says otherwise.
pub const DEFAULT_PROGRAMS: [&str; 2] = ["criu", "runc"];

/// `ldd` answers at once; past this it is killed.
const LDD_DEADLINE: Duration = Duration::from_secs(10);

/// The locked files; unlocked and unmapped when dropped.
#[derive(Debug, Default)]
pub struct Resident {
    maps: Vec<Mapping>,
}

#[derive(Debug)]
struct Mapping {
    addr: NonNull<c_void>,
    len: NonZeroUsize,
    path: PathBuf,
}

// SAFETY: the mappings are read-only, never dereferenced, and only unmapped
// by their owner's drop.
unsafe impl Send for Resident {}
// SAFETY: as above; a shared reference gives nothing to touch.
unsafe impl Sync for Resident {}

impl Drop for Resident {
    fn drop(&mut self) {
        for m in &self.maps {
            // SAFETY: a mapping this value made and nothing else uses.
            if let Err(e) = unsafe { munmap(m.addr, m.len.get()) } {
                warn!(path = %m.path.display(), "munmap: {e}");
            }
        }
    }
}

impl Resident {
    /// The files locked.
    pub fn files(&self) -> Vec<&Path> {
        self.maps.iter().map(|m| m.path.as_path()).collect()
    }

    /// Their bytes, all locked.
    pub fn bytes(&self) -> u64 {
        self.maps.iter().map(|m| m.len.get() as u64).sum()
    }
}

/// Locks `programs` (names looked up on `PATH`, or absolute paths) and
/// their libraries, logging what it did.
pub async fn lock_programs(programs: &[String]) -> Resident {
    let mut files: Vec<PathBuf> = Vec::new();
    for p in programs {
        match program_files(p).await {
            Ok(f) => files.extend(f),
            Err(e) => warn!(program = p.as_str(), "not kept in memory (each resume may read it from disk): {e}"),
        }
    }
    files.sort();
    files.dedup();
    let locked = tokio::task::spawn_blocking(move || lock_files(&files)).await.unwrap_or_else(|e| {
        warn!("locking the restore path's programs: {e}");
        Resident::default()
    });
    if !programs.is_empty() {
        info!(files = locked.maps.len(), mib = locked.bytes() >> 20, "the restore path's programs are kept in memory");
    }
    locked
}

/// Maps and locks each of `files`; one that fails is a warning.
pub fn lock_files(files: &[PathBuf]) -> Resident {
    let mut r = Resident::default();
    for f in files {
        match lock_file(f) {
            Ok(Some(m)) => r.maps.push(m),
            Ok(None) => {}
            Err(e) => warn!(path = %f.display(), "not kept in memory: {e}"),
        }
    }
    r
}

fn lock_file(path: &Path) -> Result<Option<Mapping>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("open: {e}"))?;
    let size = file.metadata().map_err(|e| format!("stat: {e}"))?.len();
    let Some(len) = usize::try_from(size).ok().and_then(NonZeroUsize::new) else { return Ok(None) };
    // SAFETY: a new read-only shared mapping of a file we opened; no
    // reference into it is ever made.
    let addr = unsafe { mmap(None, len, ProtFlags::PROT_READ, MapFlags::MAP_SHARED, &file, 0) }.map_err(|e| format!("mmap: {e}"))?;
    let m = Mapping { addr, len, path: path.to_path_buf() };
    // SAFETY: the range is the mapping just made.
    unsafe { mlock(m.addr, len.get()) }.map_err(|e| format!("mlock {} bytes: {e}", len.get()))?;
    Ok(Some(m))
}

/// The program's file and its libraries' (`ldd`), canonical.
async fn program_files(program: &str) -> Result<Vec<PathBuf>, String> {
    let path = find_program(program).ok_or_else(|| format!("{program:?} is not on PATH"))?;
    let mut cmd = tokio::process::Command::new("ldd");
    cmd.arg(&path).kill_on_drop(true).stdin(std::process::Stdio::null());
    let out = match tokio::time::timeout(LDD_DEADLINE, cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("run ldd: {e}")),
        Err(_) => return Err(format!("ldd {path:?} did not finish within {LDD_DEADLINE:?}")),
    };
    // A static program: ldd says so and fails; the program alone.
    let libs = if out.status.success() { libraries(&String::from_utf8_lossy(&out.stdout)) } else { Vec::new() };
    let mut files = vec![path];
    files.extend(libs);
    Ok(files.into_iter().filter_map(|f| f.canonicalize().ok()).collect())
}

/// The library paths of `ldd`'s output (`libc.so.6 => /lib/.../libc.so.6
/// (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`); the vDSO has none.
pub fn libraries(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|l| {
            let l = l.trim();
            let target = l.split_once("=>").map_or(l, |(_, t)| t.trim());
            target.split_whitespace().next().filter(|p| p.starts_with('/')).map(PathBuf::from)
        })
        .collect()
}

/// `program` if it is a path, else the first executable of that name on
/// `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f48)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f48)\n\tlibgone.so.1 => not found\n";
        assert_eq!(libraries(out), vec![PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"), PathBuf::from("/lib64/ld-linux-x86-64.so.2")]);
    }

    /// A program and its libraries are locked in memory while the value
    /// lives (the process's VmLck grows by their size) and no more after.
    #[tokio::test]
    async fn a_program_and_its_libraries_are_locked() {
        let before = locked_kib();
        let r = lock_programs(&["sh".to_string()]).await;
        assert!(r.files().len() >= 2, "the shell and its libc: {:?}", r.files());
        assert!(r.files().iter().any(|f| f.to_string_lossy().contains("libc")), "{:?}", r.files());
        let grew = locked_kib() - before;
        assert!(grew * 1024 >= r.bytes() as i64 - 4096 * r.files().len() as i64, "VmLck grew {grew} KiB for {} bytes", r.bytes());
        drop(r);
        assert_eq!(locked_kib(), before);
        let none = lock_programs(&["torpor-no-such-program".to_string()]).await;
        assert!(none.files().is_empty());
    }

    fn locked_kib() -> i64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines().find_map(|l| l.strip_prefix("VmLck:")).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap()
    }
}
