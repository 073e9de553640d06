//! The daemon's configuration: a TOML file (every key optional, unknown keys
//! refused) overridden by command-line flags. Reference: docs/CONFIG.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Where the daemon looks for its config file when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/torpor/snapshotter.toml";
/// Persistent state: metadata database, snapshot directories (and, later, the store).
pub const DEFAULT_ROOT: &str = "/var/lib/torpor/snapshotter";
/// containerd's proxy plugin address.
pub const DEFAULT_SNAPSHOTTER_ADDRESS: &str = "/run/torpor/snapshotter.sock";
/// The snapshot store's gRPC API.
pub const DEFAULT_STORE_ADDRESS: &str = "/run/torpor/store.sock";
pub const DEFAULT_LOG_LEVEL: &str = "info";
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The file as written (all keys optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    root: Option<PathBuf>,
    log_level: Option<String>,
    shutdown_timeout: Option<String>,
    metrics_address: Option<String>,
    resident_programs: Option<Vec<String>>,
    rcu_expedited: Option<bool>,
    #[serde(default)]
    snapshotter: FileSnapshotter,
    #[serde(default)]
    store: FileStore,
    #[serde(default)]
    tenancy: FileTenancy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTenancy {
    clone_source_namespaces: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSnapshotter {
    address: Option<PathBuf>,
    mount_options: Option<Vec<String>>,
    upperdir_label: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStore {
    address: Option<PathBuf>,
    root: Option<PathBuf>,
    local_budget: Option<String>,
    remote_url: Option<String>,
    remote_options: Option<std::collections::BTreeMap<String, String>>,
    keep_local: Option<String>,
    upload_concurrency: Option<usize>,
    fetch_concurrency: Option<usize>,
    stream_stall_timeout: Option<String>,
    stream_background_delay: Option<String>,
    retry_initial: Option<String>,
    retry_max: Option<String>,
    zstd_level: Option<i32>,
    verify_local_on_checkout: Option<bool>,
    trust_verified_local_for: Option<String>,
    gc_interval: Option<String>,
    gc_keep: Option<usize>,
    node_id: Option<String>,
    lease_ttl: Option<String>,
    surrender_timeout: Option<String>,
    encryption: Option<FileEncryption>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEncryption {
    active: Option<String>,
    keys: Option<std::collections::BTreeMap<String, PathBuf>>,
    accept_unencrypted: Option<bool>,
}

/// Refused: a key in the environment stays readable in /proc/<pid>/environ
/// for the daemon's whole life (removing the variable does not erase it).
pub const ENV_KEY: &str = "TORPOR_STORE_KEY";
/// Environment variable naming an open descriptor that holds a master key
/// (32 raw bytes or 64 hex characters), added to the keyring under
/// [`ENV_KEY_ID`]; the descriptor is read once and closed.
pub const ENV_KEY_FD: &str = "TORPOR_STORE_KEY_FD";
pub const ENV_KEY_ID: &str = "TORPOR_STORE_KEY_ID";

/// `[tenancy]`: what pods of one namespace may do with another's actors
/// (docs/SECURITY.md, "Pod authors"). Served to the shims by the store
/// API's `Policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenancySection {
    /// Namespaces whose actors a pod of any namespace may clone
    /// (`torpor.dev/restore-from: <namespace>/<actor>`): the cluster
    /// operator's golden snapshots. A pod may always clone an actor of its
    /// own namespace; by default, of no other.
    pub clone_source_namespaces: Vec<String>,
}

/// A Kubernetes namespace name: a DNS-1123 label (1 to 63 characters of
/// a-z, 0-9 and '-', starting and ending with a letter or digit).
pub fn check_namespace(n: &str) -> std::result::Result<(), String> {
    let ok = !n.is_empty()
        && n.len() <= 63
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
        && !n.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("{n:?} is not a namespace name (1 to 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit)"))
    }
}

/// Command-line overrides (each `None` when the flag was not given).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub root: Option<PathBuf>,
    pub address: Option<PathBuf>,
    pub log_level: Option<String>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub root: PathBuf,
    pub log_level: String,
    pub shutdown_timeout: Duration,
    /// Where `/metrics` is served (`None`: not served).
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Programs kept in memory for the resumes (`crate::resident`).
    pub resident_programs: Vec<String>,
    /// The node's RCU grace periods expedited while the daemon runs (`crate::rcu`).
    pub rcu_expedited: bool,
    pub snapshotter: SnapshotterSection,
    pub store: StoreSection,
    pub tenancy: TenancySection,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotterSection {
    /// Unix socket containerd's `[proxy_plugins.torpor]` connects to.
    pub address: PathBuf,
    /// Extra overlay mount options.
    pub mount_options: Vec<String>,
    /// Report upper dirs in the `containerd.io/snapshot/overlay.upperdir` label.
    pub upperdir_label: bool,
}

/// The snapshot store: its API socket and the tiered store's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSection {
    /// Unix socket of the store's API (ttrpc).
    pub address: PathBuf,
    /// The local tier (`None`: `<root>/store`).
    pub root: Option<PathBuf>,
    /// Byte budget of the local tier (`None`: the store's default, 20 GiB).
    pub local_budget: Option<u64>,
    /// Object tier URL (`s3://bucket/prefix`, `gs://…`, `az://…`, `file:///dir`;
    /// `None`: the store's default, `file:///var/lib/torpor/objects`).
    pub remote_url: Option<String>,
    /// object_store client options (`endpoint`, `region`, `allow_http`, …).
    pub remote_options: Vec<(String, String)>,
    pub keep_local: Option<Duration>,
    pub upload_concurrency: Option<usize>,
    pub fetch_concurrency: Option<usize>,
    pub stream_stall_timeout: Option<Duration>,
    pub stream_background_delay: Option<Duration>,
    pub retry_initial: Option<Duration>,
    pub retry_max: Option<Duration>,
    pub zstd_level: Option<i32>,
    pub verify_local_on_checkout: Option<bool>,
    pub trust_verified_local_for: Option<Duration>,
    /// How often superseded snapshots are collected (`None`: never; `torporctl snapshots gc` still works).
    pub gc_interval: Option<Duration>,
    /// Snapshots kept per actor by the periodic gc (≥ 1); with gc on, also
    /// the store's `prune_keep` (superseded snapshots that never left the
    /// node are removed at the next background pass).
    pub gc_keep: usize,
    /// This node's name in actor leases (`None`: `$TORPOR_NODE_ID`, else
    /// /etc/machine-id, else the host name).
    pub node_id: Option<String>,
    /// Actor lease lifetime without renewal (`None`: 30s).
    pub lease_ttl: Option<Duration>,
    /// How long a surrender waits for the actor's newest snapshot to be
    /// durable before letting the lease go anyway (`None`: 10m).
    pub surrender_timeout: Option<Duration>,
    /// `[store.encryption]` as written (key files by id).
    pub encryption: EncryptionSection,
    /// The keys, loaded by [`Config::load`] from `encryption` and the
    /// environment (empty after [`Config::parse`] alone).
    pub keyring: torpor_store::Keyring,
}

/// `[store.encryption]`: keys sealing the object tier.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EncryptionSection {
    /// The key id new uploads are sealed with (default: the only key).
    pub active: Option<String>,
    /// Key id → key file (32 raw bytes or 64 hex characters, mode 0600).
    pub keys: Vec<(String, PathBuf)>,
    /// Restore from snapshots the object tier holds unencrypted.
    pub accept_unencrypted: bool,
}

impl EncryptionSection {
    /// Load the key files and the environment's key (`lookup` reads an
    /// environment variable) into a keyring. Errors name the key and file.
    pub fn load(&self, lookup: impl Fn(&str) -> Option<String>) -> std::result::Result<torpor_store::Keyring, String> {
        use torpor_store::crypto;
        let mut keys = Vec::new();
        for (id, path) in &self.keys {
            let material = crypto::load_key_file(path).map_err(|e| format!("store.encryption.keys.{id}: {e}"))?;
            keys.push(crypto::Key::new(id, &material).map_err(|e| format!("store.encryption.keys.{id}: {e}"))?);
        }
        if lookup(ENV_KEY).is_some_and(|v| !v.is_empty()) {
            return Err(format!(
                "${ENV_KEY} is no longer read: a key in the environment stays readable in /proc/<pid>/environ for the daemon's life. \
                 Put it in a key file (store.encryption.keys, mode 0600) or pass it on a descriptor named by ${ENV_KEY_FD} (with ${ENV_KEY_ID}), and unset ${ENV_KEY}"
            ));
        }
        let env_fd = lookup(ENV_KEY_FD).filter(|v| !v.is_empty());
        let env_id = lookup(ENV_KEY_ID).filter(|v| !v.is_empty());
        // The key on the descriptor is the installation's current key (the
        // Secret's): it seals uploads unless `active` names another, and the
        // file keys beside it open what older keys sealed.
        let mut active = self.active.clone();
        match (env_fd, env_id) {
            (Some(fd), Some(id)) => {
                if self.keys.iter().any(|(k, _)| *k == id) {
                    return Err(format!("key id {id:?} is given both by ${ENV_KEY_ID} and in store.encryption.keys"));
                }
                let fd: i32 = fd.trim().parse().map_err(|_| format!("${ENV_KEY_FD} = {fd:?} is not a descriptor number"))?;
                let material = crypto::load_key_fd(fd).map_err(|e| format!("${ENV_KEY_FD} (key {id:?}): {e}"))?;
                keys.push(crypto::Key::new(&id, &material).map_err(|e| format!("${ENV_KEY_ID}: {e}"))?);
                active.get_or_insert(id);
            }
            (Some(_), None) => return Err(format!("${ENV_KEY_FD} is set but ${ENV_KEY_ID} is not: name the key")),
            (None, Some(id)) => {
                return Err(format!("${ENV_KEY_ID} = {id:?} is set but ${ENV_KEY_FD} (the descriptor holding the key) is not"))
            }
            (None, None) => {}
        }
        torpor_store::Keyring::new(keys, active.as_deref(), self.accept_unencrypted).map_err(|e| format!("store.encryption: {e}"))
    }
}

pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(3600);
pub const DEFAULT_GC_KEEP: usize = 2;

impl Config {
    /// The tiered store's configuration: the store's defaults, overridden by
    /// what the `[store]` section sets.
    pub fn store_config(&self) -> torpor_store::StoreConfig {
        let s = &self.store;
        let mut c = torpor_store::StoreConfig::new(s.root.clone().unwrap_or_else(|| self.root.join("store")));
        if let Some(b) = s.local_budget {
            c.local_budget_bytes = b;
        }
        if let Some(u) = &s.remote_url {
            c.remote_url = u.clone();
        }
        c.remote_options = s.remote_options.clone();
        if let Some(d) = s.keep_local {
            c.default_keep_local = d;
        }
        if let Some(n) = s.upload_concurrency {
            c.upload_concurrency = n;
        }
        if let Some(n) = s.fetch_concurrency {
            c.fetch_concurrency = n;
        }
        if let Some(d) = s.stream_stall_timeout {
            c.stream_stall_timeout = d;
        }
        if let Some(d) = s.stream_background_delay {
            c.stream_background_delay = d;
        }
        if let Some(d) = s.retry_initial {
            c.retry.initial = d;
        }
        if let Some(d) = s.retry_max {
            c.retry.max = d;
        }
        if let Some(l) = s.zstd_level {
            c.zstd_level = l;
        }
        if let Some(v) = s.verify_local_on_checkout {
            c.verify_local_on_checkout = v;
        }
        if let Some(d) = s.trust_verified_local_for {
            c.trust_verified_local_for = d;
        }
        if let Some(n) = &s.node_id {
            c.node_id = n.clone();
        }
        if let Some(d) = s.lease_ttl {
            c.lease_ttl = d;
        }
        if let Some(d) = s.surrender_timeout {
            c.surrender_timeout = d;
        }
        c.keyring = s.keyring.clone();
        // The periodic gc's retention, also applied at once to what never
        // left the node; with gc off, nothing is pruned either.
        c.prune_keep = s.gc_interval.map(|_| s.gc_keep);
        c
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: PathBuf::from(DEFAULT_ROOT),
            log_level: DEFAULT_LOG_LEVEL.into(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            metrics_address: None,
            resident_programs: crate::resident::DEFAULT_PROGRAMS.iter().map(|p| p.to_string()).collect(),
            rcu_expedited: true,
            snapshotter: SnapshotterSection {
                address: PathBuf::from(DEFAULT_SNAPSHOTTER_ADDRESS),
                mount_options: Vec::new(),
                upperdir_label: false,
            },
            store: StoreSection {
                address: PathBuf::from(DEFAULT_STORE_ADDRESS),
                root: None,
                local_budget: None,
                remote_url: None,
                remote_options: Vec::new(),
                keep_local: None,
                upload_concurrency: None,
                fetch_concurrency: None,
                stream_stall_timeout: None,
                stream_background_delay: None,
                retry_initial: None,
                retry_max: None,
                zstd_level: None,
                verify_local_on_checkout: None,
                trust_verified_local_for: None,
                gc_interval: Some(DEFAULT_GC_INTERVAL),
                gc_keep: DEFAULT_GC_KEEP,
                node_id: None,
                lease_ttl: None,
                surrender_timeout: None,
                encryption: EncryptionSection::default(),
                keyring: torpor_store::Keyring::default(),
            },
            tenancy: TenancySection::default(),
        }
    }
}

/// The longest duration any key takes: 3650 days (87600h). Longer ones
/// are refused, not clamped: every deadline and expiry computed from a
/// configured duration then fits (in `Instant` and in unix milliseconds).
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// Parses `500ms`, `30s`, `5m`, `1h` (at most [`MAX_DURATION`]).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| format!("{s:?} has no unit (ms, s, m, h)"))?;
    let (n, unit) = s.split_at(split);
    if n.is_empty() {
        return Err(format!("{s:?} is not <number><unit> (e.g. 30s)"));
    }
    let too_long = || format!("{s:?} is too long (at most 87600h, 3650 days)");
    let n: u64 = n.parse().map_err(|_| too_long())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if d > MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

/// Parses a byte size: `1073741824`, `512MiB`, `20GiB`, `1TiB`, `500MB`, `2GB`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not <number>[unit] (e.g. 20GiB)"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => return Err(format!("{s:?}: unknown unit {u:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// `metrics_address`: `<ip>:<port>` (`127.0.0.1:9464`, `[::1]:9464`,
/// `0.0.0.0:9464`); unset or empty: no metrics endpoint.
pub fn parse_metrics_address(v: Option<&str>) -> std::result::Result<Option<std::net::SocketAddr>, String> {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(None) };
    let a: std::net::SocketAddr = v
        .parse()
        .map_err(|_| format!("metrics_address = {v:?} is not <ip>:<port> (e.g. \"127.0.0.1:9464\"; a host name is not resolved; \"\" turns the endpoint off)"))?;
    if a.port() == 0 {
        return Err(format!("metrics_address = {v:?}: port 0 is not a port scrapers can find"));
    }
    Ok(Some(a))
}

fn check_socket_path(key: &str, p: &Path) -> Result<()> {
    if !p.is_absolute() {
        return Err(Error::Config(format!("{key} = {p:?} must be an absolute path")));
    }
    // sockaddr_un.sun_path holds 108 bytes including the terminating NUL
    if p.as_os_str().len() > 107 {
        return Err(Error::Config(format!("{key} = {p:?} is longer than a unix socket path may be (107 bytes)")));
    }
    if p.file_name().is_none() {
        return Err(Error::Config(format!("{key} = {p:?} has no file name")));
    }
    Ok(())
}

/// Checks a log filter (`info`, `debug`, `torpor_snapshotter=debug,info`, …).
pub fn check_log_level(s: &str) -> std::result::Result<(), String> {
    tracing_subscriber::EnvFilter::builder().parse(s).map(|_| ()).map_err(|e| format!("{s:?}: {e}"))
}

impl Config {
    /// Loads the configuration. `path` is the `--config` flag: a file given
    /// explicitly must exist; without the flag a missing default file means
    /// built-in defaults.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self> {
        let (file, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => None,
            Err(e) => return Err(Error::Config(format!("cannot read config file {}: {e}", file.display()))),
        };
        let mut cfg = match text {
            Some(t) => Self::parse(&t).map_err(|e| Error::Config(format!("{}: {e}", file.display())))?,
            None => Config::default(),
        };
        if let Some(r) = &overrides.root {
            cfg.root = r.clone();
        }
        if let Some(a) = &overrides.address {
            cfg.snapshotter.address = a.clone();
        }
        if let Some(l) = &overrides.log_level {
            cfg.log_level = l.clone();
        }
        cfg.validate()?;
        cfg.store.keyring =
            cfg.store.encryption.load(|k| std::env::var(k).ok()).map_err(|e| Error::Config(format!("{}: {e}", file.display())))?;
        Ok(cfg)
    }

    /// Parses and validates a config file's text.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let f: FileConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let dur = |v: Option<String>, key: &str| -> std::result::Result<Option<Duration>, String> {
            v.map(|s| parse_duration(&s).map_err(|e| format!("{key}: {e}"))).transpose()
        };
        let d = Config::default();
        let cfg = Config {
            root: f.root.unwrap_or(d.root),
            log_level: f.log_level.unwrap_or(d.log_level),
            shutdown_timeout: match f.shutdown_timeout {
                Some(s) => parse_duration(&s).map_err(|e| format!("shutdown_timeout: {e}"))?,
                None => d.shutdown_timeout,
            },
            metrics_address: parse_metrics_address(f.metrics_address.as_deref())?,
            resident_programs: match f.resident_programs {
                Some(p) => {
                    if let Some(bad) = p.iter().find(|p| p.is_empty() || p.contains('\0') || (p.contains('/') && !p.starts_with('/'))) {
                        return Err(format!("resident_programs: {bad:?} is neither a program name nor an absolute path"));
                    }
                    p
                }
                None => d.resident_programs,
            },
            rcu_expedited: f.rcu_expedited.unwrap_or(d.rcu_expedited),
            snapshotter: SnapshotterSection {
                address: f.snapshotter.address.unwrap_or(d.snapshotter.address),
                mount_options: f.snapshotter.mount_options.unwrap_or_default(),
                upperdir_label: f.snapshotter.upperdir_label.unwrap_or(false),
            },
            store: StoreSection {
                address: f.store.address.unwrap_or(d.store.address),
                local_budget: match f.store.local_budget {
                    Some(s) => Some(parse_size(&s).map_err(|e| format!("store.local_budget: {e}"))?),
                    None => None,
                },
                remote_url: f.store.remote_url,
                remote_options: f.store.remote_options.unwrap_or_default().into_iter().collect(),
                root: f.store.root,
                keep_local: dur(f.store.keep_local, "store.keep_local")?,
                upload_concurrency: f.store.upload_concurrency,
                fetch_concurrency: f.store.fetch_concurrency,
                stream_stall_timeout: dur(f.store.stream_stall_timeout, "store.stream_stall_timeout")?,
                stream_background_delay: dur(f.store.stream_background_delay, "store.stream_background_delay")?,
                retry_initial: dur(f.store.retry_initial, "store.retry_initial")?,
                retry_max: dur(f.store.retry_max, "store.retry_max")?,
                zstd_level: f.store.zstd_level,
                verify_local_on_checkout: f.store.verify_local_on_checkout,
                trust_verified_local_for: dur(f.store.trust_verified_local_for, "store.trust_verified_local_for")?,
                gc_interval: match f.store.gc_interval.as_deref() {
                    None => d.store.gc_interval,
                    Some("off") => None,
                    Some(v) => Some(parse_duration(v).map_err(|e| format!("store.gc_interval: {e} (or \"off\")"))?),
                },
                gc_keep: f.store.gc_keep.unwrap_or(d.store.gc_keep),
                node_id: f.store.node_id,
                lease_ttl: dur(f.store.lease_ttl, "store.lease_ttl")?,
                surrender_timeout: dur(f.store.surrender_timeout, "store.surrender_timeout")?,
                encryption: match f.store.encryption {
                    None => EncryptionSection::default(),
                    Some(e) => EncryptionSection {
                        active: e.active,
                        keys: e.keys.unwrap_or_default().into_iter().collect(),
                        accept_unencrypted: e.accept_unencrypted.unwrap_or(false),
                    },
                },
                keyring: torpor_store::Keyring::default(),
            },
            tenancy: TenancySection {
                clone_source_namespaces: {
                    let mut v = f.tenancy.clone_source_namespaces.unwrap_or_default();
                    for n in &v {
                        check_namespace(n).map_err(|e| format!("tenancy.clone_source_namespaces: {e}"))?;
                    }
                    v.sort();
                    v.dedup();
                    v
                },
            },
        };
        cfg.validate().map_err(|e| match e {
            Error::Config(m) => m,
            other => other.to_string(),
        })?;
        Ok(cfg)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<()> {
        if !self.root.is_absolute() {
            return Err(Error::Config(format!("root = {:?} must be an absolute path", self.root)));
        }
        check_socket_path("snapshotter.address", &self.snapshotter.address)?;
        check_socket_path("store.address", &self.store.address)?;
        if self.snapshotter.address == self.store.address {
            return Err(Error::Config(format!("snapshotter.address and store.address are the same socket {:?}", self.store.address)));
        }
        check_log_level(&self.log_level).map_err(|e| Error::Config(format!("log_level: {e}")))?;
        if self.shutdown_timeout.is_zero() {
            return Err(Error::Config("shutdown_timeout must be more than 0".into()));
        }
        for o in &self.snapshotter.mount_options {
            let name = o.split('=').next().unwrap_or("");
            if o.is_empty() || o.contains(',') {
                return Err(Error::Config(format!("snapshotter.mount_options: {o:?} must be one non-empty option (no commas)")));
            }
            if matches!(name, "lowerdir" | "upperdir" | "workdir") {
                return Err(Error::Config(format!("snapshotter.mount_options: {o:?}: {name} is set by the snapshotter")));
            }
        }
        if self.store.gc_keep == 0 {
            return Err(Error::Config("store.gc_keep must be at least 1 (the newest snapshot is never collected)".into()));
        }
        if self.store.gc_interval.is_some_and(|d| d.is_zero()) {
            return Err(Error::Config("store.gc_interval must be more than 0 (or \"off\")".into()));
        }
        let enc = &self.store.encryption;
        for (id, path) in &enc.keys {
            torpor_store::crypto::check_key_id(id).map_err(|e| Error::Config(format!("store.encryption.keys: {e}")))?;
            if !path.is_absolute() {
                return Err(Error::Config(format!("store.encryption.keys.{id} = {path:?} must be an absolute path")));
            }
        }
        if let Some(a) = &enc.active {
            torpor_store::crypto::check_key_id(a).map_err(|e| Error::Config(format!("store.encryption.active: {e}")))?;
        }
        if let Some(r) = &self.store.root {
            if !r.is_absolute() {
                return Err(Error::Config(format!("store.root = {r:?} must be an absolute path")));
            }
        }
        // The store's own checks (concurrency ranges, retry, zstd level…),
        // named by their [store] keys.
        self.store_config().validate().map_err(|e| Error::Config(format!("[store]: {e}")))?;
        if let Some(u) = &self.store.remote_url {
            let ok = u.split_once("://").is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.is_empty());
            if !ok {
                return Err(Error::Config(format!("store.remote_url = {u:?} is not a URL (s3://bucket/prefix, file:///dir, …)")));
            }
        }
        // The scheme and the client options, checked before anything is
        // created or bound (nothing is contacted or created here).
        let sc = self.store_config();
        torpor_store::Remote::check(&sc.remote_url, &sc.remote_options).map_err(|e| Error::Config(format!("store.remote_url: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn shipped_example_is_the_defaults() {
        let text = include_str!("../../deploy/torpor/snapshotter.toml");
        assert_eq!(Config::parse(text).unwrap(), Config::default());
        // and every commented key in it is a real key with its default value
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.contains(" = ") || rest.starts_with('[') => rest.split("  #").next().unwrap_or(rest),
                _ => l,
            })
            .map(|l| format!("{}\n", l.trim_end()))
            .collect();
        let c = Config::parse(&uncommented).unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(c.root, Config::default().root);
        assert_eq!(c.snapshotter, Config::default().snapshotter);
        assert_eq!(c.store.address, Config::default().store.address);
        assert_eq!(c.store.local_budget, Some(20 << 30));
        assert_eq!(c.store.encryption.active.as_deref(), Some("k1"));
        assert!(!c.store.encryption.accept_unencrypted);
    }

    #[test]
    fn the_store_prunes_by_the_gc_retention_while_gc_is_on() {
        assert_eq!(Config::default().store_config().prune_keep, Some(DEFAULT_GC_KEEP));
        let c = Config::parse("[store]\ngc_keep = 5").unwrap();
        assert_eq!(c.store_config().prune_keep, Some(5));
        let c = Config::parse("[store]\ngc_interval = \"off\"\ngc_keep = 5").unwrap();
        assert_eq!(c.store_config().prune_keep, None, "gc off: nothing is pruned either");
    }

    #[test]
    fn encryption_keys_from_files_and_the_environment() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let write_key = |name: &str, content: &[u8], mode: u32| {
            let p = d.path().join(name);
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let k1 = write_key("k1", &[1u8; 32], 0o600);
        let k2 = write_key("k2", format!("{}\n", "ab".repeat(32)).as_bytes(), 0o400);
        let text = format!(
            "[store.encryption]\nactive = \"k2\"\nkeys = {{ k1 = {:?}, k2 = {:?} }}\naccept_unencrypted = true\n",
            k1.display().to_string(),
            k2.display().to_string()
        );
        let c = Config::parse(&text).unwrap();
        assert_eq!(c.store.encryption.active.as_deref(), Some("k2"));
        assert!(c.store.encryption.accept_unencrypted);
        assert!(c.store.keyring.is_empty(), "parse alone loads no key");
        let no_env = |_: &str| None;
        let ring = c.store.encryption.load(no_env).unwrap();
        assert_eq!(ring.active().unwrap().id(), "k2");
        assert!(ring.get("k1").is_some() && ring.accept_unencrypted);

        // A key on a descriptor ($TORPOR_STORE_KEY_FD) joins the ring; the
        // descriptor is read once and closed (each call gets a new pipe).
        let hex = "cd".repeat(32);
        let key_fd = |content: &[u8]| -> String {
            use std::io::Write;
            use std::os::fd::IntoRawFd;
            let (r, w) = nix::unistd::pipe().unwrap();
            std::fs::File::from(w).write_all(content).unwrap();
            r.into_raw_fd().to_string()
        };
        let env = |k: &str| match k {
            ENV_KEY_FD => Some(key_fd(format!("{hex}\n").as_bytes())),
            ENV_KEY_ID => Some("k3".to_string()),
            _ => None,
        };
        let e = EncryptionSection { active: Some("k3".into()), ..c.store.encryption.clone() };
        let ring = e.load(env).unwrap();
        assert_eq!(ring.active().unwrap().id(), "k3");
        assert!(ring.get("k1").is_some());
        // A file key beside it and no `active`: the descriptor's key seals.
        let e = EncryptionSection { active: None, ..c.store.encryption.clone() };
        let ring = e.load(env).unwrap();
        assert_eq!(ring.active().unwrap().id(), "k3");
        assert!(ring.get("k1").is_some() && ring.get("k2").is_some());
        // Only the environment: its key is the active one.
        let ring = EncryptionSection::default().load(env).unwrap();
        assert_eq!(ring.active().unwrap().id(), "k3");
        assert!(EncryptionSection::default().load(no_env).unwrap().is_empty());

        // Errors name the key, the file, the variable.
        let loose = write_key("loose", &[2u8; 32], 0o644);
        let bad = EncryptionSection { keys: vec![("kx".into(), loose.clone())], ..Default::default() };
        let err = bad.load(no_env).unwrap_err();
        assert!(err.contains("store.encryption.keys.kx") && err.contains(loose.to_str().unwrap()) && err.contains("0644"), "{err}");
        let missing = EncryptionSection { keys: vec![("km".into(), d.path().join("nope"))], ..Default::default() };
        assert!(missing.load(no_env).unwrap_err().contains("nope"));
        let two = EncryptionSection { keys: vec![("k1".into(), k1.clone()), ("k2".into(), k2.clone())], ..Default::default() };
        assert!(two.load(no_env).unwrap_err().contains("no active"));
        let unknown = EncryptionSection { active: Some("k9".into()), keys: vec![("k1".into(), k1.clone())], ..Default::default() };
        assert!(unknown.load(no_env).unwrap_err().contains("\"k9\""));
        let dup = EncryptionSection { keys: vec![("k3".into(), k1.clone())], ..Default::default() };
        assert!(dup.load(env).unwrap_err().contains("both"));
        let only_fd = |k: &str| (k == ENV_KEY_FD).then(|| "7".to_string());
        assert!(EncryptionSection::default().load(only_fd).unwrap_err().contains(ENV_KEY_ID));
        let only_id = |k: &str| (k == ENV_KEY_ID).then(|| "k3".to_string());
        assert!(EncryptionSection::default().load(only_id).unwrap_err().contains(ENV_KEY_FD));
        let bad_hex = |k: &str| match k {
            ENV_KEY_FD => Some(key_fd(b"xyz")),
            ENV_KEY_ID => Some("k3".to_string()),
            _ => None,
        };
        let err = EncryptionSection::default().load(bad_hex).unwrap_err();
        assert!(err.contains(ENV_KEY_FD) && err.contains("k3"), "{err}");
        // Raw bytes on the descriptor are a key too.
        let raw = |k: &str| match k {
            ENV_KEY_FD => Some(key_fd(&[9u8; 32])),
            ENV_KEY_ID => Some("k4".to_string()),
            _ => None,
        };
        assert_eq!(EncryptionSection::default().load(raw).unwrap().active().unwrap().id(), "k4");
        // Not a descriptor number, stdin, or a closed descriptor: refused.
        for (fd, want) in [("x", "not a descriptor number"), ("0", "stdin"), ("1000000", "key descriptor 1000000")] {
            let e = EncryptionSection::default()
                .load(|k: &str| match k {
                    ENV_KEY_FD => Some(fd.to_string()),
                    ENV_KEY_ID => Some("k3".to_string()),
                    _ => None,
                })
                .unwrap_err();
            assert!(e.contains(want), "{fd}: {e}");
        }
        // The key in the environment itself is refused (it stays readable in
        // /proc/<pid>/environ), saying what to do instead; the key is not echoed.
        let plain_env = |k: &str| match k {
            ENV_KEY => Some(hex.clone()),
            ENV_KEY_ID => Some("k3".to_string()),
            _ => None,
        };
        let err = EncryptionSection::default().load(plain_env).unwrap_err();
        assert!(
            err.contains("no longer read") && err.contains("/proc") && err.contains(ENV_KEY_FD) && err.contains("store.encryption.keys"),
            "{err}"
        );
        assert!(!err.contains(&hex), "{err}");

        // Checked at parse: ids, absolute paths, unknown keys.
        for (text, want) in [
            ("[store.encryption]\nkeys = { \"k/1\" = \"/k\" }", "key id"),
            ("[store.encryption]\nkeys = { k1 = \"rel\" }", "store.encryption.keys.k1"),
            ("[store.encryption]\nactive = \"-x\"", "store.encryption.active"),
            ("[store.encryption]\nkey = \"/k\"", "key"),
        ] {
            let e = Config::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }

        // Config::load loads the keys and names the config file on failure.
        let f = d.path().join("c.toml");
        std::fs::write(&f, format!("[store.encryption]\nkeys = {{ kx = {:?} }}\n", loose.display().to_string())).unwrap();
        let e = Config::load(Some(&f), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("kx") && e.contains("0644"), "{e}");
        std::fs::write(&f, format!("[store.encryption]\nkeys = {{ k1 = {:?} }}\n", k1.display().to_string())).unwrap();
        let c = Config::load(Some(&f), &Overrides::default()).unwrap();
        assert_eq!(c.store_config().keyring.active().unwrap().id(), "k1");
    }

    #[test]
    fn every_key() {
        let c = Config::parse(
            r#"
root = "/srv/torpor"
log_level = "debug"
shutdown_timeout = "5s"
[snapshotter]
address = "/run/x/snap.sock"
mount_options = ["volatile"]
upperdir_label = true
[store]
address = "/run/x/store.sock"
local_budget = "20GiB"
remote_url = "s3://bucket/prefix"
"#,
        )
        .unwrap();
        assert_eq!(c.root, PathBuf::from("/srv/torpor"));
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(c.snapshotter.address, PathBuf::from("/run/x/snap.sock"));
        assert_eq!(c.snapshotter.mount_options, vec!["volatile"]);
        assert!(c.snapshotter.upperdir_label);
        assert_eq!(c.store.local_budget, Some(20 << 30));
        assert_eq!(c.store.remote_url.as_deref(), Some("s3://bucket/prefix"));
        assert_eq!(c.metrics_address, None, "no metrics endpoint unless set");
        let m = |t: &str| Config::parse(t).unwrap().metrics_address;
        assert_eq!(m("metrics_address = \"127.0.0.1:9464\""), Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(m("metrics_address = \"[::1]:9464\""), Some("[::1]:9464".parse().unwrap()));
        assert_eq!(m("metrics_address = \"\""), None, "empty: off");
        let r = |t: &str| Config::parse(t).unwrap().resident_programs;
        assert_eq!(r(""), vec!["criu", "runc"], "CRIU and runc by default");
        assert_eq!(r("resident_programs = []"), Vec::<String>::new(), "none: off");
        assert_eq!(r("resident_programs = [\"criu\", \"/opt/runc\"]"), vec!["criu", "/opt/runc"]);
        for bad in ["\"\"", "\"bin/runc\""] {
            let e = Config::parse(&format!("resident_programs = [{bad}]")).unwrap_err();
            assert!(e.contains("resident_programs"), "{e}");
        }
        let x = |t: &str| Config::parse(t).unwrap().rcu_expedited;
        assert!(x(""), "expedited by default");
        assert!(!x("rcu_expedited = false"), "false: the node's setting is left alone");
        let e = Config::parse("rcu_expedited = \"yes\"").unwrap_err();
        assert!(e.contains("rcu_expedited"), "{e}");
        let t = |t: &str| Config::parse(t).unwrap().tenancy.clone_source_namespaces;
        assert_eq!(t(""), Vec::<String>::new(), "no other namespace's actors are cloned by default");
        assert_eq!(t("[tenancy]\nclone_source_namespaces = [\"golden\", \"base-2\", \"golden\"]"), vec!["base-2", "golden"]);
    }

    #[test]
    fn bad_input_names_the_key() {
        let cases = [
            ("nope = 1", "nope"),
            ("[snapshotter]\nadress = \"/x\"", "adress"),
            ("root = \"relative\"", "root"),
            ("shutdown_timeout = \"5 parsecs\"", "shutdown_timeout"),
            ("log_level = \"[[\"", "log_level"),
            ("[snapshotter]\nmount_options = [\"upperdir=/x\"]", "mount_options"),
            ("[snapshotter]\naddress = \"rel.sock\"", "snapshotter.address"),
            ("[store]\nlocal_budget = \"lots\"", "store.local_budget"),
            ("[store]\nremote_url = \"bucket\"", "store.remote_url"),
            ("[store]\nremote_url = \"ftp://host/dir\"", "unsupported scheme"),
            ("[store]\nremote_url = \"s3://b/p\"\nremote_options = { endpont = \"x\" }", "endpont"),
            ("[store]\nremote_url = \"file:///x\"\nremote_options = { region = \"x\" }", "takes no options"),
            ("[store]\ngc_interval = \"5124095576030431h\"", "store.gc_interval"),
            ("[store]\nlease_ttl = \"18446744073709551615ms\"", "store.lease_ttl"),
            ("[store]\nlease_ttl = \"2d\"", "store.lease_ttl"),
            ("[store]\nkeep_local = \"307445734561825861m\"", "store.keep_local"),
            ("[store]\nsurrender_timeout = \"0s\"", "surrender_timeout"),
            ("shutdown_timeout = \"18446744073709551615s\"", "shutdown_timeout"),
            ("[store]\naddress = \"/run/torpor/snapshotter.sock\"", "same socket"),
            ("root = 5", "root"),
            ("metrics_address = \"localhost:9464\"", "metrics_address"),
            ("metrics_address = \"127.0.0.1\"", "metrics_address"),
            ("metrics_address = \"127.0.0.1:0\"", "port 0"),
            ("metrics_address = 9464", "metrics_address"),
            ("[tenancy]\nclone_source_namespaces = [\"Golden\"]", "tenancy.clone_source_namespaces"),
            ("[tenancy]\nclone_source_namespaces = [\"a/b\"]", "not a namespace name"),
            ("[tenancy]\nclone_sources = []", "clone_sources"),
        ];
        for (text, want) in cases {
            let e = Config::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let long = format!("[snapshotter]\naddress = \"/{}\"", "x".repeat(120));
        assert!(Config::parse(&long).unwrap_err().contains("longer"));
    }

    #[test]
    fn explicit_missing_file_is_an_error_default_missing_is_not() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing.toml");
        let e = Config::load(Some(&missing), &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
        let bad = d.path().join("bad.toml");
        std::fs::write(&bad, "root = [").unwrap();
        let e = Config::load(Some(&bad), &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("bad.toml"), "{e}");
        let good = d.path().join("good.toml");
        std::fs::write(&good, "root = \"/a\"").unwrap();
        let o = Overrides { root: Some("/b".into()), address: Some("/run/t/s.sock".into()), log_level: Some("warn".into()) };
        let c = Config::load(Some(&good), &o).unwrap();
        assert_eq!(c.root, PathBuf::from("/b"));
        assert_eq!(c.snapshotter.address, PathBuf::from("/run/t/s.sock"));
        assert_eq!(c.log_level, "warn");
        let bad_flag = Overrides { root: Some("rel".into()), ..Default::default() };
        assert!(Config::load(Some(&good), &bad_flag).is_err());
    }

    #[test]
    fn units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("h").is_err());
        assert_eq!(parse_duration("87600h").unwrap(), MAX_DURATION);
        for huge in ["87601h", "5124095576030431h", "307445734561825861m", "18446744073709551615s", "99999999999999999999ms"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("too long"), "{huge}: {e}");
        }
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("3GB").unwrap(), 3_000_000_000);
        assert!(parse_size("1PiB").is_err());
        assert!(parse_size("99999999999999TiB").is_err());
    }
}
