//! The `criu` runc runs for torpor's checkpoints and restores: this very
//! binary, found first in the PATH runc is given, standing in front of the
//! real CRIU.
//!
//! runc starts `criu swrk <fd>` twice per checkpoint or restore: first to
//! ask the VERSION over CRIU's RPC, then for the work itself. The first
//! costs a CRIU process start (about 4 ms and as much CPU) on the resume's
//! critical path, and tells nothing the shim's own version check did not.
//! The launcher answers a VERSION request with what that check found, as
//! long as the CRIU file is still the one checked; for anything else it
//! becomes the real CRIU (`exec`, same arguments and descriptors). It only
//! looks at a request already sent: runc sends the VERSION request right
//! after starting CRIU, but prepares cgroups before it sends a restore's,
//! and CRIU's own start overlaps that work.
//!
//! A lazy restore's CRIU connects to the `criu lazy-pages` daemon's socket
//! at its start. The shim starts the daemon and runc at the same time and
//! names the socket and the daemon's pid in [`ENV_LAZY_SOCKET`] and
//! [`ENV_LAZY_PID`]: the launcher becomes CRIU once the socket exists (or
//! the daemon is gone, or [`LAZY_WAIT`] passed: CRIU then fails to connect,
//! and the shim restores in full).
//!
//! It is found through PATH, the way runc ≥ 1.2 finds CRIU (its `--criu`
//! option is ignored there): runc's environment for `checkpoint` and
//! `restore` has the launcher's directory first in PATH, and the real
//! CRIU's path, version and file identity in [`ENV_BIN`], [`ENV_VERSION`]
//! and [`ENV_ID`]. Without them it refuses to run rather than guess.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use protobuf::Message;
use rust_criu::rust_criu_protobuf::rpc::{Criu_req, Criu_req_type, Criu_resp, Criu_version};

use crate::error::{Error, IoContext, Result};
use crate::system::criu::{file_id, Installed};

/// The real CRIU the launcher runs (absolute path).
pub const ENV_BIN: &str = "TORPOR_CRIU_BIN";
/// Its version, `MAJOR.MINOR.SUBLEVEL`.
pub const ENV_VERSION: &str = "TORPOR_CRIU_VERSION";
/// Its file identity when the version was read ([`file_id`]).
pub const ENV_ID: &str = "TORPOR_CRIU_ID";

/// The lazy-pages daemon's socket a restore's CRIU connects to.
pub const ENV_LAZY_SOCKET: &str = "TORPOR_LAZY_SOCKET";
/// The daemon's pid.
pub const ENV_LAZY_PID: &str = "TORPOR_LAZY_PID";
/// How long the launcher waits for the daemon to listen.
pub const LAZY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the launchers live: one directory per shim binary path, holding a
/// `criu` symlink to it (root's alone, like the rest of `/run/torpor`).
const LAUNCHER_ROOT: &str = "/run/torpor/criu-launcher";

/// The largest request looked at (a VERSION request is a few bytes; a
/// restore's, with its mounts, a few KiB).
const PEEK_MAX: usize = 64 * 1024;

/// Whether this process was started as the launcher (`criu` is its name).
pub fn invoked() -> bool {
    std::env::args_os().next().is_some_and(|a0| Path::new(&a0).file_name() == Some("criu".as_ref()))
}

/// The running binary's path.
fn own_path() -> Result<PathBuf> {
    std::env::current_exe().io_context(|| "the shim's own path".into())
}

/// The launcher directory of the binary at `exe` (not created).
fn dir_for(exe: &Path) -> PathBuf {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(exe.as_os_str().as_encoded_bytes());
    let name: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Path::new(LAUNCHER_ROOT).join(name)
}

/// The launcher directory, once [`install`] succeeded in this process.
static INSTALLED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Whether runc's CRIU goes through the launcher ([`install`] succeeded).
pub fn in_front() -> bool {
    INSTALLED.get().is_some()
}

/// [`install_once`], the first success kept for the process.
pub fn install() -> Result<PathBuf> {
    if let Some(d) = INSTALLED.get() {
        return Ok(d.clone());
    }
    let d = install_once()?;
    Ok(INSTALLED.get_or_init(|| d).clone())
}

/// Creates the launcher directory of the running binary if needed and
/// returns it: `<dir>/criu` links to this binary (replaced atomically).
fn install_once() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let exe = own_path()?;
    // A binary replaced under the running shim reads as "<path> (deleted)":
    // there is nothing to link to (runc then runs the real CRIU itself).
    if !exe.is_file() {
        return Err(Error::FailedPrecondition(format!("the shim's binary {} is no longer there", exe.display())));
    }
    remove_dangling(Path::new(LAUNCHER_ROOT));
    let dir = dir_for(&exe);
    let link = dir.join("criu");
    if std::fs::read_link(&link).is_ok_and(|t| t == exe) {
        return Ok(dir);
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).io_context(|| format!("create {}", dir.display()))?;
    let tmp = dir.join(format!(".criu.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&exe, &tmp).io_context(|| format!("link {} to {}", tmp.display(), exe.display()))?;
    std::fs::rename(&tmp, &link).io_context(|| format!("rename {} to {}", tmp.display(), link.display()))?;
    Ok(dir)
}

/// Removes the launcher directories under `root` whose binary is gone (a
/// shim binary removed or moved): theirs is a link to nothing. One still
/// being made (no link yet) is left alone.
fn remove_dangling(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for d in entries.flatten().map(|e| e.path()) {
        let link = d.join("criu");
        if std::fs::read_link(&link).is_ok_and(|target| !target.exists()) {
            let _ = std::fs::remove_file(&link);
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// The environment runc gets for a checkpoint or restore: the launcher
/// first in PATH, and what it needs to know of the real CRIU.
pub fn env(dir: &Path, criu: &Installed) -> Result<Vec<(OsString, OsString)>> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let joined = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path)))
        .map_err(|e| Error::InvalidArgument(format!("PATH with the CRIU launcher {}: {e}", dir.display())))?;
    let (a, b, c) = criu.version;
    Ok(vec![
        ("PATH".into(), joined),
        (ENV_BIN.into(), criu.bin.clone().into_os_string()),
        (ENV_VERSION.into(), format!("{a}.{b}.{c}").into()),
        (ENV_ID.into(), criu.id.clone().into()),
    ])
}

/// What the launcher does with the first request on the RPC socket.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Answer it (a VERSION request): the encoded response.
    Answer(Vec<u8>),
    /// Leave it to the real CRIU.
    Exec,
}

/// The action for the `request` bytes, knowing the real CRIU's `version`
/// (None: not known to be current, so never answered here).
fn action(request: &[u8], version: Option<(u32, u32, u32)>) -> Action {
    let Some((major, minor, sublevel)) = version else { return Action::Exec };
    let Ok(req) = Criu_req::parse_from_bytes(request) else { return Action::Exec };
    if req.type_() != Criu_req_type::VERSION {
        return Action::Exec;
    }
    let mut v = Criu_version::new();
    v.set_major_number(major as i32);
    v.set_minor_number(minor as i32);
    v.set_sublevel(sublevel as i32);
    let mut resp = Criu_resp::new();
    resp.set_type(Criu_req_type::VERSION);
    resp.set_success(true);
    resp.version = protobuf::MessageField::some(v);
    match resp.write_to_bytes() {
        Ok(b) => Action::Answer(b),
        Err(_) => Action::Exec,
    }
}

/// Parses [`ENV_VERSION`]'s `MAJOR.MINOR.SUBLEVEL`.
fn parse_env_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
    let v = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(v)
}

/// The launcher's whole life: answers a VERSION request or becomes the
/// real CRIU. Never returns.
pub fn main() -> ! {
    let args: Vec<OsString> = std::env::args_os().collect();
    let Some(real) = std::env::var_os(ENV_BIN).map(PathBuf::from).filter(|p| p.is_absolute()) else {
        die(&format!("{ENV_BIN} is not set to the real CRIU's absolute path: this launcher only runs under the torpor shim"));
    };
    let me = own_path().ok();
    if me.as_ref().is_some_and(|me| std::fs::canonicalize(&real).is_ok_and(|r| &r == me)) {
        die(&format!("{ENV_BIN} ({}) is the launcher itself", real.display()));
    }
    if args.get(1).is_some_and(|a| a == "swrk") {
        if let Some(fd) = args.get(2).and_then(|a| a.to_str()).and_then(|a| a.parse::<RawFd>().ok()) {
            // The version is vouched for only while the file is the one
            // the shim checked.
            let current = std::env::var_os(ENV_ID).is_some_and(|id| file_id(&real).is_some_and(|now| id == now.as_str()));
            let version = std::env::var(ENV_VERSION).ok().and_then(|v| parse_env_version(&v)).filter(|_| current);
            if let Some(request) = peek_sent(fd) {
                if let Action::Answer(resp) = action(&request, version) {
                    // Taken off the socket first: closing a unix socket with
                    // a message unread resets the peer's end.
                    let mut taken = vec![0u8; request.len().max(1)];
                    let answered = nix::sys::socket::recv(fd, &mut taken, nix::sys::socket::MsgFlags::empty())
                        .and_then(|_| nix::sys::socket::send(fd, &resp, nix::sys::socket::MsgFlags::empty()));
                    match answered {
                        Ok(_) => std::process::exit(0),
                        Err(e) => die(&format!("answer CRIU's VERSION request on fd {fd}: {e}")),
                    }
                }
            }
        }
    }
    if let Some(socket) = std::env::var_os(ENV_LAZY_SOCKET) {
        let pid = std::env::var(ENV_LAZY_PID).ok().and_then(|p| p.parse::<i32>().ok());
        wait_listening(Path::new(&socket), pid);
    }
    // Arguments and environment entries come from C strings, so none
    // holds a NUL byte and none is dropped here.
    let argv: Vec<std::ffi::CString> = std::iter::once(real.clone().into_os_string())
        .chain(args.into_iter().skip(1))
        .filter_map(|a| std::ffi::CString::new(a.into_encoded_bytes()).ok())
        .collect();
    let Ok(path) = std::ffi::CString::new(real.clone().into_os_string().into_encoded_bytes()) else {
        die(&format!("{ENV_BIN} ({}) holds a NUL byte", real.display()));
    };
    // CRIU, and what it runs, see the environment runc had.
    let env: Vec<std::ffi::CString> = real_criu_env(std::env::vars_os(), me.as_deref().map(dir_for).as_deref())
        .into_iter()
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            std::ffi::CString::new(kv).ok()
        })
        .collect();
    let err = nix::unistd::execve(&path, &argv, &env).err();
    die(&format!("exec {}: {}", real.display(), err.map(|e| e.to_string()).unwrap_or_default()));
}

/// The environment `vars` without what the shim added for the launcher
/// (its variables, and the launcher directory `me` in PATH).
fn real_criu_env(vars: impl Iterator<Item = (OsString, OsString)>, me: Option<&Path>) -> Vec<(OsString, OsString)> {
    let ours = [ENV_BIN, ENV_VERSION, ENV_ID, ENV_LAZY_SOCKET, ENV_LAZY_PID];
    vars.filter(|(k, _)| !ours.iter().any(|o| k == o))
        .map(|(k, v)| {
            if k != "PATH" {
                return (k, v);
            }
            let kept: Vec<PathBuf> = std::env::split_paths(&v).filter(|d| Some(d.as_path()) != me).collect();
            let v = std::env::join_paths(kept).unwrap_or(v);
            (k, v)
        })
        .collect()
}

/// Waits until the lazy-pages daemon listens on `socket`: the socket
/// exists, the daemon `pid` is gone, or [`LAZY_WAIT`] passed.
pub(crate) fn wait_listening(socket: &Path, pid: Option<i32>) {
    let started = std::time::Instant::now();
    while !socket.exists() && started.elapsed() < LAZY_WAIT {
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(250));
    }
}

/// The first message on the RPC socket `fd` if it was sent already, left
/// there for CRIU.
fn peek_sent(fd: RawFd) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; PEEK_MAX];
    loop {
        // SAFETY: buf is valid for PEEK_MAX bytes; fd is only read.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n >= 0 {
            buf.truncate(n as usize);
            return Some(buf);
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return None;
        }
    }
}

fn die(msg: &str) -> ! {
    eprintln!("torpor criu launcher: {msg}");
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(t: Criu_req_type) -> Vec<u8> {
        let mut r = Criu_req::new();
        r.set_type(t);
        r.write_to_bytes().unwrap()
    }

    #[test]
    fn a_version_request_is_answered_with_the_checked_version() {
        let Action::Answer(bytes) = action(&request(Criu_req_type::VERSION), Some((4, 2, 1))) else {
            panic!("not answered");
        };
        let resp = Criu_resp::parse_from_bytes(&bytes).unwrap();
        assert_eq!(resp.type_(), Criu_req_type::VERSION);
        assert!(resp.success());
        let v = resp.version.as_ref().unwrap();
        assert_eq!((v.major_number(), v.minor_number(), v.sublevel()), (4, 2, 1));
        assert!(v.gitid.is_none());
    }

    #[test]
    fn everything_else_goes_to_the_real_criu() {
        assert_eq!(action(&request(Criu_req_type::RESTORE), Some((4, 2, 1))), Action::Exec);
        assert_eq!(action(&request(Criu_req_type::DUMP), Some((4, 2, 1))), Action::Exec);
        // A CRIU not known to be the checked one: never answered here.
        assert_eq!(action(&request(Criu_req_type::VERSION), None), Action::Exec);
        // Bytes that are no request.
        assert_eq!(action(&[0xff, 0xff, 0xff], Some((4, 2, 1))), Action::Exec);
    }

    #[test]
    fn the_real_criu_gets_runcs_environment_back() {
        let me = Path::new("/run/torpor/criu-launcher/ab");
        let vars = [
            ("PATH", "/run/torpor/criu-launcher/ab:/usr/local/sbin:/usr/bin"),
            (ENV_BIN, "/usr/local/sbin/criu"),
            (ENV_VERSION, "4.2.1"),
            (ENV_ID, "1:2:3:4.5"),
            (ENV_LAZY_SOCKET, "/w/lazy-pages.socket"),
            (ENV_LAZY_PID, "7"),
            ("HOME", "/root"),
        ];
        let env = real_criu_env(vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))), Some(me));
        let expect: Vec<(OsString, OsString)> =
            [("PATH", "/usr/local/sbin:/usr/bin"), ("HOME", "/root")].iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect();
        assert_eq!(env, expect);
    }

    #[test]
    fn launchers_of_gone_binaries_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("shim");
        std::fs::write(&bin, "").unwrap();
        for (name, target) in [("live", bin.clone()), ("gone", root.path().join("removed-shim"))] {
            std::fs::create_dir(root.path().join(name)).unwrap();
            std::os::unix::fs::symlink(&target, root.path().join(name).join("criu")).unwrap();
        }
        std::fs::create_dir(root.path().join("making")).unwrap();
        remove_dangling(root.path());
        assert!(root.path().join("live/criu").exists());
        assert!(!root.path().join("gone").exists());
        assert!(root.path().join("making").exists(), "a launcher still being made stays");
    }

    #[test]
    fn env_versions() {
        assert_eq!(parse_env_version("4.2.1"), Some((4, 2, 1)));
        assert_eq!(parse_env_version("4.2"), None);
        assert_eq!(parse_env_version("4.2.1.7"), None);
        assert_eq!(parse_env_version("x.2.1"), None);
    }

    #[test]
    fn runc_is_given_the_launcher_first_in_path() {
        let criu = Installed { bin: "/usr/local/sbin/criu".into(), version: (4, 2, 1), id: "1:2:3:4.5".into() };
        let env = env(Path::new("/run/torpor/criu-launcher/ab"), &criu).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap();
        let path = get("PATH");
        assert_eq!(std::env::split_paths(&path).next(), Some(PathBuf::from("/run/torpor/criu-launcher/ab")));
        assert_eq!(get(ENV_BIN), "/usr/local/sbin/criu");
        assert_eq!(get(ENV_VERSION), "4.2.1");
        assert_eq!(get(ENV_ID), "1:2:3:4.5");
    }
}
