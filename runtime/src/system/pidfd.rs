//! Another process's open files, taken through its pidfd
//! (`pidfd_open(2)`, `pidfd_getfd(2)`): the same open file, a new
//! descriptor in this process.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// A pidfd of process `pid`.
pub fn open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the returned descriptor is ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A descriptor of the target's `fd` (the same open file).
pub fn get_fd(pidfd: &OwnedFd, fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the returned descriptor is ours.
    let ours = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if ours < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ours as RawFd) })
}

/// `socket:[<inode>]`, the link of a socket descriptor in `/proc/PID/fd`.
pub fn socket_inode(link: &Path) -> Option<u64> {
    link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The open sockets of process `pid`: (descriptor, socket inode). A
/// process that is gone has none.
pub fn sockets_of(pid: i32) -> Vec<(RawFd, u64)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse::<RawFd>().ok()?;
            let inode = socket_inode(&std::fs::read_link(e.path()).ok()?)?;
            Some((fd, inode))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_links_name_their_inode() {
        assert_eq!(socket_inode(Path::new("socket:[12345]")), Some(12345));
        for not in ["pipe:[1]", "socket:[x]", "/dev/null", "socket:[12"] {
            assert_eq!(socket_inode(Path::new(not)), None, "{not}");
        }
    }

    #[test]
    fn a_socket_of_this_process_is_found_and_taken() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let me = std::process::id() as i32;
        let found = sockets_of(me);
        let (fd, inode) = *found.iter().find(|(fd, _)| *fd == a.as_raw_fd()).expect("the pair's socket is listed");
        let pidfd = open(me).unwrap();
        let taken = get_fd(&pidfd, fd).unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", taken.as_raw_fd())).unwrap();
        assert_eq!(socket_inode(&link), Some(inode), "the same open socket");
    }
}
