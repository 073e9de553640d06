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
    let out = Command::new(BIN).args(["--config", missing.to_str().unwrap(), "--root", root.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.toml"), "{err}");

    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[snapshotter]\nupperdir_lable = true\n").unwrap();
    let out = Command::new(BIN).args(["--config", bad.to_str().unwrap(), "--root", root.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("upperdir_lable"), "{err}");

    let out = Command::new(BIN).args(["--root", "relative/root", "--config", "/dev/null"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"));
    assert!(!root.exists(), "nothing created on a config error");
}

fn start(root: &Path, sock: &Path, log: &Path) -> std::process::Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(BIN)
        .args(["--config", "/dev/null", "--root", root.to_str().unwrap(), "--address", sock.to_str().unwrap()])
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
    assert!(text.contains("SIGTERM") && text.contains("stopped"), "{text}");

    // and it starts again on the same root
    let mut g = Guard(Some(start(&root, &sock, &log)));
    wait_until("the socket again", || sock.exists());
    let child = g.0.as_mut().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    assert!(child.wait().unwrap().success());
    g.0 = None;
}

#[test]
fn a_bad_object_tier_url_is_refused_before_anything_is_created_or_bound() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, url, extra, want) in [
        ("ftp.toml", "ftp://host/dir", "", "unsupported scheme"),
        ("opt.toml", "s3://bucket/p", "remote_options = { endpont = \"http://x\" }\n", "endpont"),
        ("gc.toml", "file:///tmp/x", "gc_interval = \"5124095576030431h\"\n", "store.gc_interval"),
    ] {
        let cfg = private_config(tmp.path(), name, url, extra);
        let out = Command::new(BIN).args(["--config", cfg.to_str().unwrap()]).env_remove("TORPOR_STORE_KEY").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && !err.contains("panicked"), "{name}: {err}");
        assert!(!tmp.path().join("root").exists(), "{name}: no state created");
        assert!(!tmp.path().join("run").exists(), "{name}: no socket bound");
    }
}

/// A config of a daemon living entirely under `dir`, plus `extra` TOML.
fn private_config(dir: &Path, name: &str, remote_url: &str, extra: &str) -> std::path::PathBuf {
    let cfg = dir.join(name);
    let text = format!(
        "root = {:?}\n[snapshotter]\naddress = {:?}\n[store]\naddress = {:?}\nremote_url = {remote_url:?}\n{extra}",
        dir.join("root").display().to_string(),
        dir.join("run/snapshotter.sock").display().to_string(),
        dir.join("run/store.sock").display().to_string(),
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// Starts the daemon with `cfg` and `env`, waits for its store socket, stops
/// it with SIGTERM; returns its log.
fn run_briefly(dir: &Path, cfg: &Path, env: &[(&str, &str)]) -> String {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let log = dir.join("log");
    let mut cmd = Command::new(BIN);
    cmd.args(["--config", cfg.to_str().unwrap()]).stdin(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
    cmd.env_remove("TORPOR_STORE_KEY").env_remove("TORPOR_STORE_KEY_ID").env_remove("TORPOR_STORE_KEY_FD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut g = Guard(Some(cmd.spawn().unwrap()));
    let sock = dir.join("run/store.sock");
    wait_until("the store socket", || sock.exists());
    let child = g.0.as_mut().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
    g.0 = None;
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn encryption_keys_are_checked_at_start_and_logged() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let objects = format!("file://{}", tmp.path().join("objects").display());
    let key = tmp.path().join("k1");
    std::fs::write(&key, [7u8; 32]).unwrap();

    // A key file others can read: exit 2 naming the key and the file, nothing touched.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let enc = format!("[store.encryption]\nkeys = {{ k1 = {:?} }}\n", key.display().to_string());
    let cfg = private_config(tmp.path(), "loose.toml", &objects, &enc);
    let out = Command::new(BIN).args(["--config", cfg.to_str().unwrap()]).env_remove("TORPOR_STORE_KEY").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("store.encryption.keys.k1") && err.contains(key.to_str().unwrap()) && err.contains("0644"), "{err}");
    assert!(!tmp.path().join("root").exists(), "nothing created on a key error");

    // A key in the environment is refused (it would stay readable in
    // /proc/<pid>/environ), saying where to put it instead; nothing touched.
    let plain_cfg = private_config(tmp.path(), "plain.toml", &objects, "");
    let out = Command::new(BIN)
        .args(["--config", plain_cfg.to_str().unwrap()])
        .env("TORPOR_STORE_KEY", "ab".repeat(32))
        .env("TORPOR_STORE_KEY_ID", "env-k")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TORPOR_STORE_KEY is no longer read") && err.contains("TORPOR_STORE_KEY_FD"), "{err}");
    assert!(!err.contains(&"ab".repeat(32)), "{err}");
    assert!(!tmp.path().join("root").exists(), "nothing created on a key error");
    // A key descriptor without its id.
    let out = Command::new(BIN)
        .args(["--config", plain_cfg.to_str().unwrap()])
        .env("TORPOR_STORE_KEY_FD", "3")
        .env_remove("TORPOR_STORE_KEY_ID")
        .env_remove("TORPOR_STORE_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TORPOR_STORE_KEY_ID"), "{}", String::from_utf8_lossy(&out.stderr));

    // Good keys (a file, and one on a descriptor the daemon inherits): the
    // ring and its check values are logged, never the key.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let enc = format!("[store.encryption]\nactive = \"k1\"\nkeys = {{ k1 = {:?} }}\n", key.display().to_string());
    let cfg = private_config(tmp.path(), "sealed.toml", &objects, &enc);
    let hex = "cd".repeat(32);
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    {
        use std::io::Write;
        std::fs::File::from(write_end).write_all(hex.as_bytes()).unwrap();
    }
    let fd = {
        use std::os::fd::AsRawFd;
        read_end.as_raw_fd().to_string()
    };
    let log = run_briefly(tmp.path(), &cfg, &[("TORPOR_STORE_KEY_FD", &fd), ("TORPOR_STORE_KEY_ID", "fd-k")]);
    drop(read_end);
    assert!(log.contains("object tier encrypted") && log.contains("k1 (check ") && log.contains("fd-k (check "), "{log}");
    assert!(!log.contains(&hex), "the key is never logged: {log}");

    // No key: plaintext, a warning for every object tier (a local directory too).
    let log = run_briefly(tmp.path(), &plain_cfg, &[]);
    assert!(log.contains("WARN") && log.contains("NOT encrypted") && log.contains("process memory"), "{log}");
    let s3_cfg = private_config(
        tmp.path(),
        "s3.toml",
        "s3://bucket/prefix",
        "remote_options = { endpoint = \"http://127.0.0.1:9\", region = \"us-east-1\", allow_http = \"true\", access_key_id = \"a\", secret_access_key = \"b\" }\n",
    );
    // (a different local tier: a store refuses to switch object tiers)
    std::fs::remove_dir_all(tmp.path().join("root")).unwrap();
    let log = run_briefly(tmp.path(), &s3_cfg, &[]);
    assert!(log.contains("WARN") && log.contains("NOT encrypted"), "{log}");
}
