//! `torporctl node ...`: plumbing of the node installer
//! (deploy/kubernetes/image/node.sh), hidden from `--help`.
//!
//! `node socket-peer PATH` names the process that serves a unix socket: the
//! pid its listener was created by (`SO_PEERCRED` of a connection to it,
//! translated into this PID namespace), which a pod cannot fake without the
//! host's socket path. With `--mount-ns-of 1` that process must also run in
//! PID 1's mount namespace (the host's, seen from a pod with `hostPID`).
//! The installer finds containerd this way, never by scanning processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Subcommand;

/// A socket that takes longer than this to accept a connection counts as hung.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

#[derive(Subcommand)]
pub enum Cmd {
    /// Print the pid of the process serving the unix socket PATH (its
    /// SO_PEERCRED, in this PID namespace).
    SocketPeer {
        path: PathBuf,
        /// Refuse (exit 1) unless that process runs in the mount namespace
        /// of process PID (1: the host's).
        #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
        mount_ns_of: Option<i32>,
        /// Where procfs is (tests).
        #[arg(long, default_value = "/proc", hide = true)]
        proc_root: PathBuf,
    },
    /// What the installer needs to know of containerd's config: prints
    /// shell assignments (version, imports, the runc runtime's
    /// SystemdCgroup, the CRI plugin's config version). FILE and the
    /// imports are host paths, read under --root.
    ContainerdConfig {
        file: PathBuf,
        /// Where the host's / is (the node pod's /host).
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// A drop-in to leave out of the imports read (the installer's own).
        #[arg(long)]
        ignore: Option<PathBuf>,
    },
    /// torpor-snapshotter's config for the node pod: FILE (a host path
    /// under --root; absent: the defaults) with the object tier's client
    /// options from --options-dir (a mounted Secret: one file per option,
    /// e.g. aws_secret_access_key) merged into [store] remote_options.
    /// Printed (the caller writes it to a root-only tmpfs); warns when the
    /// object tier is a local directory.
    SnapshotterConfig {
        file: PathBuf,
        #[arg(long, default_value = "/")]
        root: PathBuf,
        #[arg(long)]
        options_dir: Option<PathBuf>,
        /// Sets metrics_address.
        #[arg(long)]
        metrics_address: Option<String>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("connect to {}: {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("connect to {}: no answer within {}s", path.display(), CONNECT_LIMIT.as_secs())]
    ConnectTimeout { path: PathBuf },
    #[error("SO_PEERCRED of a connection to {}: {source}", path.display())]
    PeerCred { path: PathBuf, source: std::io::Error },
    #[error("{} is served by a process outside this PID namespace (SO_PEERCRED pid {pid:?}): run with the host's PID namespace (hostPID)", path.display())]
    PidNotVisible { path: PathBuf, pid: Option<i32> },
    #[error("read {}: {source}", path.display())]
    ReadNs { path: PathBuf, source: std::io::Error },
    #[error(
        "{} is served by pid {pid}, whose mount namespace {theirs} is not the host's (pid {host_pid}'s, {host}): refusing it (the host's containerd runs in the host's mount namespace; a process in another one, e.g. in a pod, is not it)",
        socket.display()
    )]
    ForeignMountNs { socket: PathBuf, pid: i32, theirs: String, host_pid: i32, host: String },
}

pub fn run(cmd: &Cmd) -> Result<(), String> {
    match cmd {
        Cmd::SocketPeer { path, mount_ns_of, proc_root } => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| NodeError::Runtime(e).to_string())?;
            let pid = rt.block_on(socket_peer(path)).map_err(|e| e.to_string())?;
            if let Some(host_pid) = mount_ns_of {
                check_mount_ns(proc_root, *host_pid, pid, path).map_err(|e| e.to_string())?;
            }
            println!("{pid}");
            Ok(())
        }
        Cmd::SnapshotterConfig { file, root, options_dir, metrics_address } => {
            let (text, warning) = snapshotter_config(root, file, options_dir.as_deref(), metrics_address.as_deref())?;
            if let Some(w) = warning {
                eprintln!("{w}");
            }
            print!("{text}");
            Ok(())
        }
        Cmd::ContainerdConfig { file, root, ignore } => {
            let c = containerd_config(root, file, ignore.as_deref())?;
            print!("{}", c.shell());
            Ok(())
        }
    }
}

/// What [`containerd_config`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ContainerdConfig {
    /// The main config's `version` (0: none given, i.e. containerd's v1 format).
    pub version: i64,
    /// Its `imports`, as written (host paths, globs).
    pub imports: Vec<String>,
    /// `SystemdCgroup` of the CRI runtime `runc`'s options (main config or an import); None: not set.
    pub systemd_cgroup: Option<bool>,
}

impl ContainerdConfig {
    /// Shell assignments: CONTAINERD_CONFIG_VERSION, CONTAINERD_IMPORTS
    /// (newline-separated), CONTAINERD_SYSTEMD_CGROUP (true|false|unset).
    pub fn shell(&self) -> String {
        let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
        format!(
            "CONTAINERD_CONFIG_VERSION={}\nCONTAINERD_IMPORTS={}\nCONTAINERD_SYSTEMD_CGROUP={}\n",
            self.version,
            q(&self.imports.join("\n")),
            self.systemd_cgroup.map_or("unset", |b| if b { "true" } else { "false" })
        )
    }
}

/// Reads containerd's main config `file` (a host path under `root`) and
/// the files its imports name (globs in the last component), but `ignore`.
pub fn containerd_config(root: &Path, file: &Path, ignore: Option<&Path>) -> Result<ContainerdConfig, String> {
    let main = read_toml(root, file)?;
    let mut c = ContainerdConfig {
        version: main.get("version").and_then(|v| v.as_integer()).unwrap_or(0),
        imports: main
            .get("imports")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        systemd_cgroup: runc_systemd_cgroup(&main),
    };
    for pattern in c.imports.clone() {
        for f in expand(root, Path::new(&pattern))? {
            if Some(f.as_path()) == ignore {
                continue;
            }
            if let Some(b) = runc_systemd_cgroup(&read_toml(root, &f)?) {
                c.systemd_cgroup = Some(b);
            }
        }
    }
    Ok(c)
}

fn under(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

fn read_toml(root: &Path, file: &Path) -> Result<toml::Table, String> {
    let path = under(root, file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read containerd's config {}: {e}", file.display()))?;
    text.parse::<toml::Table>().map_err(|e| format!("containerd's config {}: not TOML: {e}", file.display()))
}

/// The host paths an import names: itself, or the files of its directory
/// that match a `*` glob in its last component (sorted, as containerd does).
fn expand(root: &Path, pattern: &Path) -> Result<Vec<PathBuf>, String> {
    let name = pattern.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let Some((pre, post)) = name.split_once('*') else { return Ok(vec![pattern.to_path_buf()]) };
    let dir = pattern.parent().unwrap_or(Path::new("/"));
    let rd = match std::fs::read_dir(under(root, dir)) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", dir.display())),
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post))
        .map(|n| dir.join(n))
        .collect();
    v.sort();
    Ok(v)
}

/// The snapshotter's config (see [`Cmd::SnapshotterConfig`]) and the
/// warning about a local object tier, if any.
pub fn snapshotter_config(
    root: &Path,
    file: &Path,
    options_dir: Option<&Path>,
    metrics_address: Option<&str>,
) -> Result<(String, Option<String>), String> {
    let mut t = match std::fs::read_to_string(under(root, file)) {
        Ok(text) => text.parse::<toml::Table>().map_err(|e| format!("{}: not TOML: {e}", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => toml::Table::new(),
        Err(e) => return Err(format!("read {}: {e}", file.display())),
    };
    if let Some(a) = metrics_address {
        t.insert("metrics_address".into(), toml::Value::String(a.to_string()));
    }
    let store = t.entry("store").or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let store = store.as_table_mut().ok_or_else(|| format!("{}: [store] is not a table", file.display()))?;
    if let Some(dir) = options_dir {
        let mut names: Vec<PathBuf> =
            std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?.flatten().map(|e| e.path()).collect();
        names.sort();
        let opts = store.entry("remote_options").or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let opts = opts.as_table_mut().ok_or_else(|| format!("{}: store.remote_options is not a table", file.display()))?;
        for p in names {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // a Secret volume's entries are symlinks into ..data; its dot-entries are not options
            if name.starts_with('.') || !p.is_file() {
                continue;
            }
            let v = std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
            opts.insert(name, toml::Value::String(v.trim_end_matches(['\n', '\r']).to_string()));
        }
    }
    let url = store.get("remote_url").and_then(|v| v.as_str()).unwrap_or("file:///var/lib/torpor/objects").to_string();
    let warning = url.starts_with("file://").then(|| {
        format!(
            "WARNING: the object tier is a local directory ({url}): snapshots are not durable beyond this node's disk, and an actor cannot move to another node. Set store.remote_url to an object store (s3://, gs://, az://)."
        )
    });
    let text = toml::to_string(&t).map_err(|e| format!("write the config: {e}"))?;
    Ok((text, warning))
}

/// `SystemdCgroup` of the CRI runtime `runc`: config version 3
/// (`io.containerd.cri.v1.runtime`) or 2 (`io.containerd.grpc.v1.cri`).
fn runc_systemd_cgroup(t: &toml::Table) -> Option<bool> {
    let plugins = t.get("plugins")?.as_table()?;
    ["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"]
        .iter()
        .find_map(|p| plugins.get(*p)?.get("containerd")?.get("runtimes")?.get("runc")?.get("options")?.get("SystemdCgroup")?.as_bool())
}

/// The pid of the process that created the listener of the unix socket at
/// `path`, in this PID namespace.
pub async fn socket_peer(path: &Path) -> Result<i32, NodeError> {
    let stream = match tokio::time::timeout(CONNECT_LIMIT, tokio::net::UnixStream::connect(path)).await {
        Err(_) => return Err(NodeError::ConnectTimeout { path: path.to_path_buf() }),
        Ok(Err(source)) => return Err(NodeError::Connect { path: path.to_path_buf(), source }),
        Ok(Ok(s)) => s,
    };
    let cred = stream.peer_cred().map_err(|source| NodeError::PeerCred { path: path.to_path_buf(), source })?;
    // 0: the listener's process is not visible from this PID namespace
    match cred.pid() {
        Some(pid) if pid > 0 => Ok(pid),
        pid => Err(NodeError::PidNotVisible { path: path.to_path_buf(), pid }),
    }
}

/// The mount namespace of `pid` (`mnt:[4026531841]`), from `proc_root`.
fn mount_ns(proc_root: &Path, pid: i32) -> Result<String, NodeError> {
    let path = proc_root.join(pid.to_string()).join("ns/mnt");
    std::fs::read_link(&path).map(|t| t.to_string_lossy().into_owned()).map_err(|source| NodeError::ReadNs { path, source })
}

/// Refuses `pid` (the peer of `socket`) unless it runs in the mount
/// namespace of `host_pid` (the host's: PID 1's).
pub fn check_mount_ns(proc_root: &Path, host_pid: i32, pid: i32, socket: &Path) -> Result<(), NodeError> {
    let host = mount_ns(proc_root, host_pid)?;
    let theirs = mount_ns(proc_root, pid)?;
    if theirs == host {
        Ok(())
    } else {
        Err(NodeError::ForeignMountNs { socket: socket.to_path_buf(), pid, theirs, host_pid, host })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshotter_config_takes_the_secret_options_and_warns_of_a_local_tier() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/torpor")).unwrap();
        let secret = tempfile::tempdir().unwrap();
        std::fs::write(secret.path().join("aws_secret_access_key"), "s3cr3t\n").unwrap();
        std::fs::create_dir(secret.path().join("..data")).unwrap();
        let f = Path::new("/etc/torpor/snapshotter.toml");
        // absent: the defaults, whose object tier is a local directory
        let (text, warn) = snapshotter_config(root.path(), f, Some(secret.path()), None).unwrap();
        assert!(warn.unwrap().contains("file:///var/lib/torpor/objects"));
        let t: toml::Table = text.parse().unwrap();
        assert_eq!(t["store"]["remote_options"]["aws_secret_access_key"].as_str(), Some("s3cr3t"));
        std::fs::write(
            root.path().join("etc/torpor/snapshotter.toml"),
            "log_level = 'debug'\n[store]\nremote_url = 's3://b/p'\nremote_options = { endpoint = 'http://s3:9000' }\n",
        )
        .unwrap();
        let (text, warn) = snapshotter_config(root.path(), f, Some(secret.path()), Some("127.0.0.1:9464")).unwrap();
        assert_eq!(warn, None);
        assert_eq!(toml::from_str::<toml::Table>(&text).unwrap()["metrics_address"].as_str(), Some("127.0.0.1:9464"));
        let t: toml::Table = text.parse().unwrap();
        assert_eq!(t["log_level"].as_str(), Some("debug"));
        assert_eq!(t["store"]["remote_options"]["endpoint"].as_str(), Some("http://s3:9000"));
        assert_eq!(t["store"]["remote_options"]["aws_secret_access_key"].as_str(), Some("s3cr3t"));
        assert_eq!(t["store"]["remote_options"].as_table().unwrap().len(), 2, "{text}");
    }

    #[test]
    fn containerd_config_finds_imports_and_the_cgroup_driver() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc/containerd");
        std::fs::create_dir_all(etc.join("conf.d")).unwrap();
        std::fs::write(
            etc.join("config.toml"),
            "version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\nSystemdCgroup = true\n",
        )
        .unwrap();
        let c = containerd_config(root.path(), Path::new("/etc/containerd/config.toml"), None).unwrap();
        assert_eq!(c, ContainerdConfig { version: 3, imports: vec!["/etc/containerd/conf.d/*.toml".into()], systemd_cgroup: Some(true) });
        assert_eq!(
            c.shell(),
            "CONTAINERD_CONFIG_VERSION=3\nCONTAINERD_IMPORTS='/etc/containerd/conf.d/*.toml'\nCONTAINERD_SYSTEMD_CGROUP=true\n"
        );
        // an import overrides the main config; the installer's own drop-in is left out
        std::fs::write(
            etc.join("conf.d/10-cgroup.toml"),
            "version = 2\n[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]\nSystemdCgroup = false\n",
        )
        .unwrap();
        std::fs::write(etc.join("conf.d/torpor.toml"), "not = [toml").unwrap();
        std::fs::write(etc.join("conf.d/notes.txt"), "not = [toml").unwrap();
        let c =
            containerd_config(root.path(), Path::new("/etc/containerd/config.toml"), Some(Path::new("/etc/containerd/conf.d/torpor.toml")))
                .unwrap();
        assert_eq!(c.systemd_cgroup, Some(false));
        // a v2 main config without imports nor runc options
        std::fs::write(etc.join("config.toml"), "version = 2\n").unwrap();
        let c = containerd_config(root.path(), Path::new("/etc/containerd/config.toml"), None).unwrap();
        assert_eq!(c.shell(), "CONTAINERD_CONFIG_VERSION=2\nCONTAINERD_IMPORTS=''\nCONTAINERD_SYSTEMD_CGROUP=unset\n");
        let e = containerd_config(root.path(), Path::new("/etc/containerd/missing.toml"), None).unwrap_err();
        assert!(e.contains("/etc/containerd/missing.toml"), "{e}");
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn the_peer_of_a_socket_is_its_listeners_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.sock");
        // a listener that never accepts: the connection completes in the backlog
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let pid = rt().block_on(socket_peer(&path)).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        // and its mount namespace is what the check compares
        let mine = mount_ns(Path::new("/proc"), pid).unwrap();
        assert!(mine.starts_with("mnt:["), "{mine}");
    }

    #[test]
    fn no_listener_is_an_error_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.sock");
        let e = rt().block_on(socket_peer(&absent)).unwrap_err();
        assert!(matches!(e, NodeError::Connect { .. }), "{e:?}");
        assert!(e.to_string().contains(&absent.display().to_string()), "{e}");
        // a socket file whose listener is gone: refused, not a stale pid
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let e = rt().block_on(socket_peer(&stale)).unwrap_err();
        assert!(e.to_string().contains("stale.sock") && e.to_string().contains("refused"), "{e}");
        // a regular file is no socket
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(rt().block_on(socket_peer(&file)).is_err());
    }

    /// A procfs stand-in: `<root>/<pid>/ns/mnt` links to `target`.
    fn fake_proc(root: &Path, pid: i32, target: &str) {
        let ns = root.join(pid.to_string()).join("ns");
        std::fs::create_dir_all(&ns).unwrap();
        std::os::unix::fs::symlink(target, ns.join("mnt")).unwrap();
    }

    #[test]
    fn only_a_process_in_pid_1s_mount_namespace_passes() {
        let proc_root = tempfile::tempdir().unwrap();
        let p = proc_root.path();
        fake_proc(p, 1, "mnt:[4026531841]");
        fake_proc(p, 4242, "mnt:[4026531841]");
        fake_proc(p, 777, "mnt:[4026532999]");
        let sock = Path::new("/run/containerd/containerd.sock");
        check_mount_ns(p, 1, 4242, sock).unwrap();
        let e = check_mount_ns(p, 1, 777, sock).unwrap_err();
        let msg = e.to_string();
        for part in ["/run/containerd/containerd.sock", "pid 777", "mnt:[4026532999]", "pid 1's, mnt:[4026531841]"] {
            assert!(msg.contains(part), "{part} missing: {msg}");
        }
        // another reference process: the same comparison
        check_mount_ns(p, 777, 777, sock).unwrap();
        assert!(check_mount_ns(p, 4242, 777, sock).is_err());
        // a pid that is gone: an error naming what could not be read
        let e = check_mount_ns(p, 1, 999, sock).unwrap_err();
        assert!(e.to_string().contains("999/ns/mnt"), "{e}");
    }

    #[test]
    fn the_real_procfs_tells_mount_namespaces_apart() {
        let proc_root = Path::new("/proc");
        let me = std::process::id() as i32;
        let sock = Path::new("x.sock");
        check_mount_ns(proc_root, me, me, sock).unwrap();
        // a child in a mount namespace of its own
        let mut child = std::process::Command::new("unshare").args(["--mount", "sleep", "60"]).spawn().unwrap();
        let pid = child.id() as i32;
        // unshare has made its namespace once its exe is sleep's
        let start = std::time::Instant::now();
        while std::fs::read_link(format!("/proc/{pid}/exe")).map(|e| !e.ends_with("sleep")).unwrap_or(true) {
            assert!(start.elapsed() < Duration::from_secs(30), "unshare did not exec sleep");
            std::thread::sleep(Duration::from_millis(10));
        }
        let refused = check_mount_ns(proc_root, me, pid, sock);
        child.kill().unwrap();
        child.wait().unwrap();
        let e = refused.unwrap_err();
        assert!(matches!(e, NodeError::ForeignMountNs { .. }), "{e}");
        assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
    }
}
