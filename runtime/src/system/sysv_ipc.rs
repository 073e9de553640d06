//! The SysV IPC objects (shared memory segments, semaphore sets, message
//! queues) of a pod's IPC namespace, which outlives its app containers.
//!
//! CRIU dumps every object of that namespace with a container that joined
//! it (the `ipcns-shm`, `-sem` and `-msg` images), and its restore, which
//! joins the pod's namespace again, creates each one anew with its id and
//! key (`IPC_CREAT | IPC_EXCL`): an object the dump left behind fails the
//! restore (`Failed to create shm set: File exists`). PostgreSQL keeps such
//! a segment, so its resume failed. After a suspend's dump, [`remove_dumped`]
//! removes what the dump holds from the namespace: the restore brings them
//! back, and the suspended pod does not keep their memory meanwhile.

use std::path::Path;

use nix::errno::Errno;
use nix::sched::CloneFlags;

use crate::error::{Error, IoContext, Result};
use crate::system::netns::in_namespace;

/// What [`remove_dumped`] removed, and the segments it left (still attached).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    pub shm: usize,
    pub sem: usize,
    pub msg: usize,
    /// Ids of shared memory segments some process still has attached.
    pub attached: Vec<i32>,
}

/// Removes from IPC namespace `ns` (a `/proc/<pid>/ns/ipc` path) every
/// semaphore set and message queue, and every shared memory segment that
/// no process has attached: after a dump, the dumped processes are gone,
/// and what they used is in the images.
pub fn remove_dumped(ns: &Path) -> Result<Removed> {
    in_namespace(ns, CloneFlags::CLONE_NEWIPC, "IPC namespace", || Ok(remove_in_own_namespace()))?
}

/// [`remove_dumped`] in the calling thread's IPC namespace (`/proc/sysvipc`
/// lists the reader's).
fn remove_in_own_namespace() -> Result<Removed> {
    let mut removed = Removed::default();
    for (id, nattch) in listed("shm", 6)? {
        if nattch > 0 {
            removed.attached.push(id);
        } else if rmid(id, "shared memory segment", |id| unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) })? {
            removed.shm += 1;
        }
    }
    for (id, _) in listed("sem", 1)? {
        if rmid(id, "semaphore set", |id| unsafe { libc::semctl(id, 0, libc::IPC_RMID) })? {
            removed.sem += 1;
        }
    }
    for (id, _) in listed("msg", 1)? {
        if rmid(id, "message queue", |id| unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) })? {
            removed.msg += 1;
        }
    }
    Ok(removed)
}

/// `/proc/sysvipc/<kind>`: each object's id (the second column) and the
/// number in column `col` (0-based).
fn listed(kind: &str, col: usize) -> Result<Vec<(i32, u64)>> {
    let path = format!("/proc/sysvipc/{kind}");
    let text = std::fs::read_to_string(&path).io_context(|| format!("read {path}"))?;
    parse_listing(&text, col).map_err(|line| Error::Corrupt(format!("{path}: unexpected line {line:?}")))
}

fn parse_listing(text: &str, col: usize) -> std::result::Result<Vec<(i32, u64)>, String> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let id = f.get(1).and_then(|v| v.parse().ok());
            let n = f.get(col).and_then(|v| v.parse().ok());
            id.zip(n).ok_or_else(|| l.to_string())
        })
        .collect()
}

/// `IPC_RMID` of object `id`; false if it was gone already.
fn rmid(id: i32, what: &str, call: impl FnOnce(i32) -> libc::c_int) -> Result<bool> {
    if call(id) == 0 {
        return Ok(true);
    }
    match Errno::last() {
        Errno::EINVAL | Errno::EIDRM => Ok(false),
        e => Err(Error::Sys { context: format!("remove SysV {what} {id}"), source: e }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_parse() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   10015692          2   600                    56    19    21      0   101   101   101   101 1796000000 1796000001 1796000000                  4096                     0\n";
        assert_eq!(parse_listing(shm, 6).unwrap(), vec![(2, 0)]);
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n         0          7   600         17   101   101   101   101          0 1796000000\n";
        assert_eq!(parse_listing(sem, 1).unwrap(), vec![(7, 7)]);
        assert_eq!(parse_listing("header only\n", 6).unwrap(), vec![]);
        assert!(parse_listing("h\n1 x 3\n", 1).is_err());
    }

    /// In an IPC namespace of its own (a child unshared as root): a
    /// detached segment, a semaphore set and a queue are removed; a
    /// segment still attached stays.
    #[test]
    fn dumped_objects_go_and_attached_segments_stay() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root (a new IPC namespace)");
            return;
        }
        let r = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWIPC).expect("unshare the IPC namespace");
            let ns = format!("/proc/self/task/{}/ns/ipc", nix::unistd::gettid());
            unsafe {
                let detached = libc::shmget(0x5150, 4096, libc::IPC_CREAT | 0o600);
                assert!(detached >= 0);
                let kept = libc::shmget(0x5151, 4096, libc::IPC_CREAT | 0o600);
                let at = libc::shmat(kept, std::ptr::null(), 0);
                assert_ne!(at as isize, -1);
                assert!(libc::semget(0x5152, 2, libc::IPC_CREAT | 0o600) >= 0);
                assert!(libc::msgget(0x5153, libc::IPC_CREAT | 0o600) >= 0);
                let removed = remove_dumped(Path::new(&ns)).expect("remove");
                assert_eq!((removed.shm, removed.sem, removed.msg, removed.attached.clone()), (1, 1, 1, vec![kept]));
                assert_eq!(listed("shm", 6).unwrap(), vec![(kept, 1)]);
                assert!(listed("sem", 1).unwrap().is_empty() && listed("msg", 1).unwrap().is_empty());
                libc::shmdt(at);
                libc::shmctl(kept, libc::IPC_RMID, std::ptr::null_mut());
            }
        })
        .join();
        assert!(r.is_ok(), "the test thread failed");
    }
}
