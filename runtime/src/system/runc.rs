//! The runc command driver. Every call goes through the [`reaper`](crate::system::reaper);
//! a failure carries the last error runc wrote to its JSON log (for a
//! checkpoint or restore, that names the CRIU log too).
//!
//! Every call has a deadline ([`reaper`] kills runc's process group, CRIU
//! included, when it passes): [`SHORT_DEADLINE`] for state-like calls and
//! create/exec/start, [`CRIU_DEADLINE`] for checkpoint and restore; set in
//! whole seconds by `$TORPOR_RUNC_TIMEOUT_S` and `$TORPOR_CRIU_TIMEOUT_S`.
//! The deadline bounds the runc invocation: after `create`, `exec` or
//! `restore --detach` returned, the container process is not touched.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tracing::{debug, warn};

use crate::error::{Error, IoContext, Result};
use crate::system::{criu_launcher, reaper};

/// Where torpor keeps runc's state, one directory per containerd namespace.
pub const DEFAULT_ROOT: &str = "/run/torpor/runc";

/// Deadline of runc calls that do not run CRIU (state, kill, delete, pause,
/// ps, update, create, start, exec): `$TORPOR_RUNC_TIMEOUT_S`.
pub const SHORT_DEADLINE: Duration = Duration::from_secs(60);
/// Deadline of `runc checkpoint` and `runc restore` (CRIU writes or reads
/// the whole memory): `$TORPOR_CRIU_TIMEOUT_S`.
pub const CRIU_DEADLINE: Duration = Duration::from_secs(600);
pub const SHORT_DEADLINE_ENV: &str = "TORPOR_RUNC_TIMEOUT_S";
pub const CRIU_DEADLINE_ENV: &str = "TORPOR_CRIU_TIMEOUT_S";

/// Which deadline a runc subcommand gets.
fn deadline_of(subcommand: &str) -> Result<Duration> {
    match subcommand {
        "checkpoint" | "restore" => reaper::deadline_from_env(CRIU_DEADLINE_ENV, CRIU_DEADLINE),
        _ => reaper::deadline_from_env(SHORT_DEADLINE_ENV, SHORT_DEADLINE),
    }
}

/// runc, bound to a state root and a bundle's log file.
#[derive(Debug, Clone)]
pub struct Runc {
    binary: PathBuf,
    root: PathBuf,
    log: PathBuf,
    /// Global flags from the runtime options (`--systemd-cgroup`).
    global: Vec<std::ffi::OsString>,
    /// `runc create` flags from the runtime options.
    create_flags: Vec<&'static str>,
}

/// The stdio a container or exec process gets, as runc is given it.
pub struct ProcessStdio {
    pub stdin: std::process::Stdio,
    pub stdout: std::process::Stdio,
    pub stderr: std::process::Stdio,
}

#[derive(Deserialize)]
struct LogLine {
    level: String,
    msg: String,
}

impl Runc {
    /// runc for a container of `namespace` in `bundle`: `$TORPOR_RUNC` or
    /// `runc` from PATH, state under [`DEFAULT_ROOT`]/namespace.
    pub fn for_namespace(namespace: &str, bundle: &Path) -> Self {
        let binary = std::env::var_os("TORPOR_RUNC").unwrap_or_else(|| "runc".into());
        Runc::new(binary, Path::new(DEFAULT_ROOT).join(namespace), bundle)
    }

    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>, bundle: &Path) -> Self {
        Runc { binary: binary.into(), root: root.into(), log: bundle.join("log.json"), global: Vec::new(), create_flags: Vec::new() }
    }

    /// runc for a container of `namespace` in `bundle`, as containerd's
    /// runtime options `o` say (runc-v2's semantics; unset ones default as
    /// in [`Runc::for_namespace`]).
    pub fn for_options(namespace: &str, bundle: &Path, o: &crate::system::runc_options::RuncOptions) -> Self {
        let mut r = Runc::for_namespace(namespace, bundle);
        if let Some(b) = &o.binary_name {
            r.binary = b.clone();
        }
        if let Some(root) = &o.root {
            r.root = root.join(namespace);
        }
        if o.systemd_cgroup {
            r.global.push("--systemd-cgroup".into());
        }
        if o.no_pivot_root {
            r.create_flags.push("--no-pivot");
        }
        if o.no_new_keyring {
            r.create_flags.push("--no-new-keyring");
        }
        r
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--root").arg(&self.root).arg("--log").arg(&self.log).arg("--log-format").arg("json").args(&self.global).args(args);
        c
    }

    /// runc's state directory of container `id`.
    pub fn state_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Whether runc runs with no global flags (`--systemd-cgroup`): its
    /// state is then what a direct CRIU restore writes
    /// ([`crate::system::criu_restore`]).
    pub fn plain(&self) -> bool {
        self.global.is_empty()
    }

    /// The last error-level message runc logged, or `fallback`.
    pub fn last_error(&self, fallback: &str) -> String {
        let Ok(text) = std::fs::read_to_string(&self.log) else {
            return fallback.to_string();
        };
        text.lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<LogLine>(l).ok())
            .find(|l| l.level == "error" || l.level == "fatal")
            .map(|l| l.msg)
            .unwrap_or_else(|| fallback.to_string())
    }

    fn failed(&self, command: &str, stderr: &[u8]) -> Error {
        let stderr = String::from_utf8_lossy(stderr).trim().to_string();
        let message = self.last_error(&stderr);
        // runc's own message already starts with "runc <command> failed: ".
        let prefix = format!("runc {command} failed: ");
        Error::Runc { command: command.to_string(), message: message.strip_prefix(&prefix).map(str::to_string).unwrap_or(message) }
    }

    /// A timeout of the reaper as a runc error naming the subcommand.
    fn timed_out(&self, args: &[&str], deadline: Duration, e: Error) -> Error {
        if !reaper::is_timeout(&e) {
            return e;
        }
        let env = if matches!(args[0], "checkpoint" | "restore") { CRIU_DEADLINE_ENV } else { SHORT_DEADLINE_ENV };
        Error::Io {
            context: format!(
                "runc {} {} did not finish within {deadline:?} (runc and what it ran, CRIU included, were killed; ${env} sets the deadline)",
                args[0],
                args.last().copied().unwrap_or("")
            ),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline exceeded"),
        }
    }

    /// Runs a runc subcommand that does not touch a container's stdio.
    async fn run(&self, args: &[&str]) -> Result<Vec<u8>> {
        self.run_env(args, &[]).await
    }

    /// [`Runc::run`] with `env` added to runc's environment.
    async fn run_env(&self, args: &[&str], env: &[(OsString, OsString)]) -> Result<Vec<u8>> {
        debug!(args = ?args, "runc");
        let deadline = deadline_of(args[0])?;
        let mut cmd = self.command(args);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let out = reaper::output(cmd, deadline).await.map_err(|e| self.timed_out(args, deadline, e))?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(self.failed(args[0], &out.stderr))
        }
    }

    /// Runs a runc subcommand that hands `stdio` to the container process.
    async fn run_with_stdio(&self, args: &[&str], stdio: ProcessStdio) -> Result<()> {
        self.run_with_stdio_fds(args, stdio, &[], &[]).await
    }

    /// [`Runc::run_with_stdio`], with the descriptors `inherit` open in
    /// runc (and so in the CRIU it starts) as numbers
    /// [`FIRST_INHERITED_FD`], [`FIRST_INHERITED_FD`] + 1, ..., and `env`
    /// added to its environment.
    async fn run_with_stdio_fds(
        &self,
        args: &[&str],
        stdio: ProcessStdio,
        inherit: &[InheritFd],
        env: &[(OsString, OsString)],
    ) -> Result<()> {
        debug!(args = ?args, inherited = inherit.len(), "runc");
        let mut cmd = self.command(args);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(stdio.stdin).stdout(stdio.stdout).stderr(stdio.stderr);
        if !inherit.is_empty() {
            reaper::pass_fds(&mut cmd, inherit.iter().map(|i| i.fd.clone()).collect(), FIRST_INHERITED_FD);
        }
        let deadline = deadline_of(args[0])?;
        let code = reaper::status(cmd, deadline).await.map_err(|e| self.timed_out(args, deadline, e))?;
        if code == 0 {
            Ok(())
        } else {
            Err(self.failed(args[0], format!("exit status {code}").as_bytes()))
        }
    }

    /// `runc create`: the init process waits for `start`.
    pub async fn create(&self, id: &str, bundle: &Path, pid_file: &Path, console_socket: Option<&Path>, stdio: ProcessStdio) -> Result<()> {
        let bundle = bundle.to_string_lossy();
        let pid_file = pid_file.to_string_lossy();
        let console = console_socket.map(|p| p.to_string_lossy().into_owned());
        let mut args = vec!["create", "--bundle", &bundle, "--pid-file", &pid_file];
        args.extend(self.create_flags.iter().copied());
        if let Some(c) = &console {
            args.extend(["--console-socket", c]);
        }
        args.push(id);
        self.run_with_stdio(&args, stdio).await
    }

    pub async fn start(&self, id: &str) -> Result<()> {
        self.run(&["start", id]).await.map(|_| ())
    }

    /// `runc exec --detach` of the process described in `process_json`.
    pub async fn exec(
        &self,
        id: &str,
        process_json: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: ProcessStdio,
    ) -> Result<()> {
        let process = process_json.to_string_lossy();
        let pid_file = pid_file.to_string_lossy();
        let console = console_socket.map(|p| p.to_string_lossy().into_owned());
        let mut args = vec!["exec", "--detach", "--process", &process, "--pid-file", &pid_file];
        if let Some(c) = &console {
            args.extend(["--console-socket", c]);
        }
        args.push(id);
        self.run_with_stdio(&args, stdio).await
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, &sig]);
        self.run(&args).await.map(|_| ())
    }

    pub async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let mut args = vec!["delete"];
        if force {
            args.push("--force");
        }
        args.push(id);
        self.run(&args).await.map(|_| ())
    }

    pub async fn pause(&self, id: &str) -> Result<()> {
        self.run(&["pause", id]).await.map(|_| ())
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        self.run(&["resume", id]).await.map(|_| ())
    }

    pub async fn ps(&self, id: &str) -> Result<Vec<i32>> {
        let out = self.run(&["ps", "--format", "json", id]).await?;
        let pids: Option<Vec<i32>> =
            serde_json::from_slice(&out).map_err(|source| Error::Json { context: format!("parse runc ps of {id}"), source })?;
        Ok(pids.unwrap_or_default())
    }

    /// `runc update --resources FILE` with an OCI LinuxResources JSON document.
    pub async fn update(&self, id: &str, resources_json: &[u8], scratch: &Path) -> Result<()> {
        let file = scratch.join(format!(".update-{}.json", std::process::id()));
        std::fs::write(&file, resources_json).io_context(|| format!("write {file:?}"))?;
        let f = file.to_string_lossy().into_owned();
        let r = self.run(&["update", "--resources", &f, id]).await;
        let _ = std::fs::remove_file(&file);
        r.map(|_| ())
    }
}

/// What a checkpoint is asked to do (containerd's CheckpointOptions).
#[derive(Debug, Clone, Default)]
pub struct CheckpointOpts {
    /// Stop the container after the dump (otherwise it keeps running).
    pub exit: bool,
    pub open_tcp: bool,
    pub external_unix_sockets: bool,
    pub terminal: bool,
    pub file_locks: bool,
    pub empty_namespaces: Vec<String>,
    /// CRIU's cgroup mode: soft, full, strict or ignore (empty: runc's default).
    pub cgroups_mode: String,
    pub image_path: PathBuf,
    pub work_path: PathBuf,
    /// Resources of the dump that stay outside it (CRIU's `--external`,
    /// such as `unix[INODE]`): set through the container's CRIU
    /// configuration, which runc reads (runc has no flag for them).
    pub external: Vec<String>,
    /// The caller holds the network lock for the dump
    /// ([`crate::system::netns::lock_network`]): CRIU is told
    /// `network-lock skip`, which the image records for its restores.
    pub network_locked: bool,
}

impl Runc {
    /// `runc checkpoint`. On failure the error quotes CRIU's log.
    pub async fn checkpoint(&self, id: &str, o: &CheckpointOpts) -> Result<()> {
        let env = criu_env().await?;
        let args = checkpoint_args(id, o);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_env(&refs, &env).await.map(|_| ()).map_err(|e| self.with_criu_log(e, &o.work_path, "dump.log"))
    }

    /// `runc restore --detach` of `image` into the bundle's container.
    pub async fn restore(
        &self,
        id: &str,
        bundle: &Path,
        from: &RestoreFrom,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: ProcessStdio,
    ) -> Result<()> {
        let (b, i, w, p) =
            (bundle.to_string_lossy(), from.image.to_string_lossy(), from.work.to_string_lossy(), pid_file.to_string_lossy());
        let mut env = criu_env().await?;
        if let Some(pid) = from.lazy_daemon {
            if env.is_empty() {
                return Err(Error::FailedPrecondition(
                    "a lazy-pages daemon that may not listen yet, and no CRIU launcher to wait for it".into(),
                ));
            }
            env.push((criu_launcher::ENV_LAZY_SOCKET.into(), from.work.join("lazy-pages.socket").into_os_string()));
            env.push((criu_launcher::ENV_LAZY_PID.into(), pid.to_string().into()));
        }
        let console = console_socket.map(|p| p.to_string_lossy().into_owned());
        let mut args = vec![
            "restore",
            "--detach",
            "--no-subreaper",
            "--tcp-established",
            "--bundle",
            &b,
            "--image-path",
            &i,
            "--work-path",
            &w,
            "--pid-file",
            &p,
        ];
        if from.lazy {
            args.push("--lazy-pages");
        }
        if let Some(c) = &console {
            args.extend(["--console-socket", c, "--shell-job"]);
        }
        args.push(id);
        self.run_with_stdio_fds(&args, stdio, &from.inherit, &env).await.map_err(|e| self.with_criu_log(e, &from.work, "restore.log"))
    }

    /// A restore driven over CRIU's RPC without runc
    /// ([`crate::system::criu_restore`]) failed with `e`: reported as a
    /// failed `runc restore` would be, with CRIU's log.
    pub fn direct_restore_failed(&self, e: Error, work: &Path) -> Error {
        let e = Error::Runc {
            command: "restore".into(),
            message: format!("{e} (CRIU driven by the shim; log file: {})", work.join("restore.log").display()),
        };
        self.with_criu_log(e, work, "restore.log")
    }

    /// Adds the error lines of CRIU's log to a runc error and keeps the full
    /// log beside the bundle's runc log (`criu-<log>`).
    fn with_criu_log(&self, e: Error, work: &Path, log: &str) -> Error {
        let Error::Runc { command, message } = e else { return e };
        let src = work.join(log);
        // Only the end of the log matters, and a runaway CRIU can write
        // gigabytes: read and keep at most the last LOG_TAIL bytes.
        let Some(text) = read_tail(&src, LOG_TAIL) else {
            return Error::Runc { command, message };
        };
        let kept = self.log.with_file_name(format!("criu-{log}"));
        let _ = std::fs::write(&kept, &text);
        let errors: Vec<&str> =
            text.lines().filter(|l| (l.contains("Error") || l.contains("rror (")) && !l.contains("RLIMIT_NOFILE")).collect();
        let tail = &errors[errors.len().saturating_sub(8)..];
        // runc names the log in the work directory, which may be temporary.
        let message = message.replace(&src.to_string_lossy().into_owned(), &kept.to_string_lossy());
        Error::Runc { command, message: format!("{message}; CRIU log ({}):\n{}", kept.display(), tail.join("\n")) }
    }
}

/// The environment of a runc that runs CRIU, once CRIU passed its check:
/// the [`criu_launcher`] in front of it (without the launcher, with a
/// warning, runc runs CRIU from PATH itself).
async fn criu_env() -> Result<Vec<(OsString, OsString)>> {
    let criu = crate::system::criu::check().await?;
    match criu_launcher::install().and_then(|dir| criu_launcher::env(&dir, criu)) {
        Ok(env) => Ok(env),
        Err(e) => {
            warn!("runc runs CRIU without torpor's launcher in front of it: {e}");
            Ok(Vec::new())
        }
    }
}

/// `runc checkpoint` arguments for containerd's CheckpointOptions.
fn checkpoint_args(id: &str, o: &CheckpointOpts) -> Vec<String> {
    let mut args = vec![
        "checkpoint".to_string(),
        "--image-path".into(),
        o.image_path.to_string_lossy().into_owned(),
        "--work-path".into(),
        o.work_path.to_string_lossy().into_owned(),
    ];
    if !o.exit {
        args.push("--leave-running".into());
    }
    for (on, flag) in [
        (o.open_tcp, "--tcp-established"),
        (o.external_unix_sockets, "--ext-unix-sk"),
        (o.terminal, "--shell-job"),
        (o.file_locks, "--file-locks"),
    ] {
        if on {
            args.push(flag.into());
        }
    }
    for ns in &o.empty_namespaces {
        args.extend(["--empty-ns".into(), ns.clone()]);
    }
    if !o.cgroups_mode.is_empty() {
        args.extend(["--manage-cgroups-mode".into(), o.cgroups_mode.clone()]);
    }
    args.push(id.into());
    args
}

/// At most this much of a CRIU log is read or kept.
const LOG_TAIL: u64 = 1 << 20;

fn read_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max)).ok()?;
    }
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// What `runc restore` restores from.
#[derive(Debug, Clone)]
pub struct RestoreFrom {
    /// CRIU image directory.
    pub image: PathBuf,
    /// CRIU work directory (logs; the lazy-pages socket).
    pub work: PathBuf,
    /// Memory is served on demand by a `criu lazy-pages` daemon listening
    /// in `work` (userfaultfd), instead of being copied first.
    pub lazy: bool,
    /// The pid of that daemon when it may not listen yet (it was started
    /// beside runc): CRIU waits for it, through the [`criu_launcher`].
    pub lazy_daemon: Option<i32>,
    /// Open files the restored processes get instead of new ones (CRIU's
    /// `--inherit-fd`), set through the container's CRIU configuration
    /// ([`RestoreFrom::criu_options`]).
    pub inherit: Vec<InheritFd>,
}

/// Where the descriptors a restore hands to CRIU begin: above runc's own
/// (its stdio and the CRIU socket pair it passes as 3 and up).
pub const FIRST_INHERITED_FD: i32 = 100;

/// A descriptor CRIU restores a file onto: `resource` names the file of the
/// dump it stands for (`socket:[INODE]`).
#[derive(Debug, Clone)]
pub struct InheritFd {
    pub resource: String,
    pub fd: Arc<OwnedFd>,
}

impl RestoreFrom {
    /// The CRIU configuration lines for [`RestoreFrom::inherit`].
    ///
    /// No network lock option: CRIU restores with the method the dump
    /// recorded, whatever it is told.
    pub fn criu_options(&self) -> Vec<String> {
        self.inherit.iter().zip(FIRST_INHERITED_FD..).map(|(i, n)| format!("inherit-fd fd[{n}]:{}", i.resource)).collect()
    }
}

impl CheckpointOpts {
    /// The CRIU configuration lines for [`CheckpointOpts::external`] and
    /// [`CheckpointOpts::network_locked`].
    pub fn criu_options(&self) -> Vec<String> {
        let mut o: Vec<String> = self.external.iter().map(|e| format!("external {e}")).collect();
        if self.network_locked {
            o.push("network-lock skip".into());
        }
        o
    }
}

/// Reads a pid file written by runc.
pub fn read_pid(path: &Path) -> Result<i32> {
    let s = std::fs::read_to_string(path).io_context(|| format!("read pid file {path:?}"))?;
    s.trim().parse().map_err(|_| Error::InvalidArgument(format!("pid file {path:?} holds {s:?}, not a pid")))
}

/// Maps runc's kill errors onto NotFound, as containerd expects for a
/// process that is already gone.
pub fn is_not_running(e: &Error) -> bool {
    match e {
        Error::Runc { message, .. } => {
            let m = message.to_lowercase();
            m.contains("not running")
                || m.contains("process already finished")
                || m.contains("no such process")
                || m.contains("does not exist")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_options_bind_binary_root_and_flags() {
        use crate::system::runc_options::RuncOptions;
        let o = RuncOptions {
            binary_name: Some("/opt/bin/runc".into()),
            root: Some("/run/containerd/runc".into()),
            systemd_cgroup: true,
            no_pivot_root: true,
            ..Default::default()
        };
        let r = Runc::for_options("k8s.io", Path::new("/b"), &o);
        let c = r.command(&["state", "c1"]);
        assert_eq!(c.get_program(), "/opt/bin/runc");
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(&args[..2], ["--root", "/run/containerd/runc/k8s.io"]);
        assert!(args.iter().any(|a| a == "--systemd-cgroup"), "{args:?}");
        assert_eq!(&args[args.len() - 2..], ["state", "c1"]);
        assert_eq!(r.create_flags, ["--no-pivot"]);
        let plain = Runc::for_options("default", Path::new("/b"), &RuncOptions::default());
        let args: Vec<String> = plain.command(&["ps"]).get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(&args[..2], ["--root", "/run/torpor/runc/default"]);
        assert!(!args.iter().any(|a| a == "--systemd-cgroup"));
    }

    #[test]
    fn checkpoint_options_map_onto_runc_flags() {
        let o = CheckpointOpts { image_path: "/img".into(), work_path: "/work".into(), ..Default::default() };
        assert_eq!(checkpoint_args("c1", &o), ["checkpoint", "--image-path", "/img", "--work-path", "/work", "--leave-running", "c1"]);
        let o = CheckpointOpts {
            exit: true,
            open_tcp: true,
            external_unix_sockets: true,
            terminal: true,
            file_locks: true,
            empty_namespaces: vec!["network".into()],
            cgroups_mode: "soft".into(),
            image_path: "/img".into(),
            work_path: "/work".into(),
            external: vec!["unix[7]".into()],
            network_locked: true,
        };
        assert_eq!(o.criu_options(), ["external unix[7]", "network-lock skip"]);
        let a = checkpoint_args("c1", &o);
        for flag in ["--tcp-established", "--ext-unix-sk", "--shell-job", "--file-locks"] {
            assert!(a.iter().any(|x| x == flag), "{flag} missing in {a:?}");
        }
        assert!(!a.iter().any(|x| x == "--leave-running"));
        assert!(a.windows(2).any(|w| w == ["--empty-ns", "network"]));
        assert!(a.windows(2).any(|w| w == ["--manage-cgroups-mode", "soft"]));
        assert_eq!(a.last().map(String::as_str), Some("c1"));
    }

    /// A runc that hangs is killed at its deadline; the error names the
    /// subcommand, the container and the deadline.
    #[tokio::test]
    async fn a_hung_runc_fails_at_its_deadline() {
        let d = tempfile::tempdir().unwrap();
        let fake = d.path().join("runc");
        std::fs::write(&fake, "#!/bin/sh\nexec sleep 1000\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let runc = Runc::new(&fake, d.path().join("root"), d.path());
        let deadline = Duration::from_millis(200);
        let args = ["state", "c1"];
        let e = reaper::output(runc.command(&args), deadline).await.map_err(|e| runc.timed_out(&args, deadline, e)).unwrap_err();
        let msg = e.to_string();
        assert!(reaper::is_timeout(&e), "{msg}");
        assert!(msg.contains("runc state c1") && msg.contains("200ms") && msg.contains(SHORT_DEADLINE_ENV), "{msg}");
    }

    /// The child sees the inherited descriptors at 100, 101... (the same
    /// open files), named so in CRIU's options; the shim keeps its own.
    #[tokio::test]
    async fn inherited_descriptors_reach_the_child_at_their_numbers() {
        use std::os::fd::AsRawFd;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let inherit: Vec<InheritFd> =
            [a, b].into_iter().map(|s| InheritFd { resource: "socket:[1]".into(), fd: Arc::new(OwnedFd::from(s)) }).collect();
        let from = RestoreFrom { image: "/i".into(), work: "/w".into(), lazy: false, lazy_daemon: None, inherit: inherit.clone() };
        assert_eq!(from.criu_options(), ["inherit-fd fd[100]:socket:[1]", "inherit-fd fd[101]:socket:[1]"]);
        let mut cmd = Command::new("readlink");
        cmd.args(["/proc/self/fd/100", "/proc/self/fd/101"]);
        reaper::pass_fds(&mut cmd, inherit.iter().map(|i| i.fd.clone()).collect(), FIRST_INHERITED_FD);
        let out = reaper::output(cmd, std::time::Duration::from_secs(600)).await.unwrap();
        assert!(out.status.success(), "{out:?}");
        let ours: Vec<String> = inherit
            .iter()
            .map(|i| std::fs::read_link(format!("/proc/self/fd/{}", i.fd.as_raw_fd())).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), ours);
    }

    #[test]
    fn subcommands_get_their_deadlines() {
        // Neither variable is set in the test environment.
        assert_eq!(deadline_of("checkpoint").unwrap(), CRIU_DEADLINE);
        assert_eq!(deadline_of("restore").unwrap(), CRIU_DEADLINE);
        for c in ["state", "kill", "delete", "create", "start", "exec", "ps", "update", "pause", "resume"] {
            assert_eq!(deadline_of(c).unwrap(), SHORT_DEADLINE, "{c}");
        }
    }

    #[test]
    fn reads_only_the_tail_of_a_log() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        std::fs::write(&p, "a".repeat(100) + "END").unwrap();
        assert_eq!(read_tail(&p, 3).as_deref(), Some("END"));
        assert_eq!(read_tail(&p, 1000).map(|s| s.len()), Some(103));
        assert_eq!(read_tail(&d.path().join("none"), 3), None);
    }
}
