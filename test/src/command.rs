//! Running the programs the tests drive (crictl, ctr, torporctl, scripts),
//! polling with a liveness limit, and temp files.

use serde_json::Value;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::names::unique_name;
use crate::COMMAND_LIMIT;

// ---------------------------------------------------------------- commands

/// Result of one command.
#[derive(Debug, Clone)]
pub struct Output {
    /// What was run (for messages).
    pub cmdline: String,
    /// Exit code; 128+N when killed by signal N.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Panics with the full output unless the command succeeded; returns stdout.
    #[track_caller]
    pub fn ok(self) -> String {
        if self.code != 0 {
            panic!("command failed: {self}");
        }
        self.stdout
    }

    /// Both streams, for error-message assertions.
    pub fn all_output(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmdline,
            self.code,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// Runs a program to completion with an optional stdin, capturing both
/// streams. Panics if it cannot be started (missing dependency = failure) or
/// if it is still running after `limit` (it is killed first).
#[track_caller]
pub fn run_with<I, S>(program: &str, args: I, stdin: Option<&[u8]>, limit: Duration) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_env(program, args, stdin, limit, &[])
}

/// [`run_with`] with extra environment variables for the program.
#[track_caller]
pub fn run_env<I, S>(program: &str, args: I, stdin: Option<&[u8]>, limit: Duration, env: &[(String, String)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let cmdline =
        std::iter::once(program.to_string()).chain(args.iter().map(|a| a.to_string_lossy().into_owned())).collect::<Vec<_>>().join(" ");
    let mut command = Command::new(program);
    // crictl: use the rig's config file, never the host's /etc/crictl.yaml
    // (and no warning about it missing on every call).
    let crictl_cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/rig/crictl.yaml");
    if Path::new(crictl_cfg).is_file() {
        command.env("CRI_CONFIG_FILE", crictl_cfg);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = command
        .args(&args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{cmdline}`: {e} (is the rig installed? see test/rig/up.sh)"));
    let stdin_thread = stdin.map(|data| {
        let data = data.to_vec();
        let mut pipe = child.stdin.take().expect("stdin pipe");
        thread::spawn(move || {
            let _ = pipe.write_all(&data);
            // dropping the pipe closes it: EOF for the reader
        })
    });
    let mut out_pipe = child.stdout.take().expect("stdout pipe");
    let mut err_pipe = child.stderr.take().expect("stderr pipe");
    let out_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_thread = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                let stdout = String::from_utf8_lossy(&out_thread.join().unwrap_or_default()).into_owned();
                let stderr = String::from_utf8_lossy(&err_thread.join().unwrap_or_default()).into_owned();
                panic!("`{cmdline}` still running after {limit:?} (hung), killed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for `{cmdline}`: {e}"),
        }
    };
    if let Some(t) = stdin_thread {
        let _ = t.join();
    }
    let stdout = String::from_utf8_lossy(&out_thread.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_thread.join().unwrap_or_default()).into_owned();
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Output { cmdline, code, stdout, stderr }
}

/// Runs a program with no stdin and the default command limit.
#[track_caller]
pub fn run<I, S>(program: &str, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_with(program, args, None, COMMAND_LIMIT)
}

/// Polls `f` until it returns `Some`, failing the test after `limit`
/// (a liveness limit: never used to judge speed).
#[track_caller]
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_millis(50);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

// ------------------------------------------------------------- temp files

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh directory named `<prefix>-<unique>` under $TMPDIR/torpor-tests.
    pub fn new(prefix: &str) -> TempDir {
        Self::named(&unique_name(prefix))
    }

    /// $TMPDIR/torpor-tests/<name> (name must already be unique).
    pub fn named(name: &str) -> TempDir {
        let path = std::env::temp_dir().join("torpor-tests").join(name);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Writes `value` as JSON to `dir/name` and returns the path as a String.
pub fn write_json(dir: &Path, name: &str, value: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(value).unwrap()).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p.to_string_lossy().into_owned()
}
