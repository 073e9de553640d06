//! The `torpor-snapshotter` binary: config errors, startup, SIGTERM.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_torpor-snapshotter");

/// Polls `f` for up to a minute (liveness only).
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_config_is_a_clear_error_and_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let missing = tmp.path().join("missing.toml");
    let out = Command::new(BIN)
        .args([
            "--config",
            missing.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.toml"), "{err}");

    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[snapshotter]\nupperdir_lable = true\n").unwrap();
    let out = Command::new(BIN)
        .args([
            "--config",
            bad.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("upperdir_lable"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args(["--root", "relative/root", "--config", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"));
    assert!(!root.exists(), "nothing created on a config error");
}

fn start(root: &Path, sock: &Path, log: &Path) -> std::process::Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(BIN)
        .args([
            "--config",
            "/dev/null",
            "--root",
            root.to_str().unwrap(),
            "--address",
            sock.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Kills the child if the test fails before it is stopped.
struct Guard(Option<std::process::Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn starts_serves_and_stops_cleanly_on_sigterm() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let sock = tmp.path().join("run/snapshotter.sock");
    let log = tmp.path().join("log");
    let mut g = Guard(Some(start(&root, &sock, &log)));
    wait_until("the socket", || sock.exists());
    assert!(root.join("metadata.db").is_file());
    assert!(root.join("snapshots").is_dir());

    // a second daemon on the same socket refuses to start
    let other = tmp.path().join("root2");
    let out = Command::new(BIN)
        .args(["--config", "/dev/null", "--root", other.to_str().unwrap()])
        .args(["--address", sock.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));

    let child = g.0.as_mut().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    g.0 = None;
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "socket removed on shutdown");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("SIGTERM") && text.contains("stopped"),
        "{text}"
    );

    // and it starts again on the same root
    let mut g = Guard(Some(start(&root, &sock, &log)));
    wait_until("the socket again", || sock.exists());
    let child = g.0.as_mut().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    assert!(child.wait().unwrap().success());
    g.0 = None;
}
