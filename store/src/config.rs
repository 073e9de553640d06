//! Store configuration.

use std::path::PathBuf;
use std::time::Duration;

use crate::crypto::Keyring;
use crate::error::{Error, Result};

/// Retry of uploads (and remote removals) that failed because the object tier
/// was unreachable: exponential backoff from `initial`, doubling, capped at
/// `max`, with jitter (each delay is drawn from [delay/2, delay]).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryConfig {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig { initial: Duration::from_secs(1), max: Duration::from_secs(60) }
    }
}

impl RetryConfig {
    /// The delay before attempt number `attempt + 1` (attempt counts failures so far, ≥ 1).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let base = self.initial.saturating_mul(1u32 << exp).min(self.max);
        let half = base / 2;
        half + Duration::from_nanos(fastrand::u64(0..=half.as_nanos().min(u64::MAX as u128) as u64))
    }
}

/// Content-defined chunking (FastCDC 2020) sizes in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkingConfig {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        ChunkingConfig { min: 128 * 1024, avg: 512 * 1024, max: 2 * 1024 * 1024 }
    }
}

impl ChunkingConfig {
    fn validate(&self) -> Result<()> {
        let (min, avg, max) = (self.min as usize, self.avg as usize, self.max as usize);
        let ok = (fastcdc::v2020::MINIMUM_MIN..=fastcdc::v2020::MINIMUM_MAX).contains(&min)
            && (fastcdc::v2020::AVERAGE_MIN..=fastcdc::v2020::AVERAGE_MAX).contains(&avg)
            && (fastcdc::v2020::MAXIMUM_MIN..=fastcdc::v2020::MAXIMUM_MAX).contains(&max)
            && min <= avg
            && avg <= max
            && min % 2 == 0
            && avg % 2 == 0
            && max % 2 == 0;
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidConfig(format!(
                "chunking min/avg/max = {min}/{avg}/{max}: need even sizes with min ≤ avg ≤ max, min in {}..={}, avg in {}..={}, max in {}..={}",
                fastcdc::v2020::MINIMUM_MIN,
                fastcdc::v2020::MINIMUM_MAX,
                fastcdc::v2020::AVERAGE_MIN,
                fastcdc::v2020::AVERAGE_MAX,
                fastcdc::v2020::MAXIMUM_MIN,
                fastcdc::v2020::MAXIMUM_MAX
            )))
        }
    }
}

/// Configuration of a `Store`. `StoreConfig::new(root)` gives
/// the defaults; every field is public so a daemon can fill it from its config
/// file.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The local tier: `<root>/snapshots`, `<root>/staging`, `<root>/store.redb`.
    pub root: PathBuf,
    /// Byte budget of the local tier (logical bytes of local snapshots). Over
    /// it, durable unpinned snapshots are evicted least recently used first;
    /// when nothing is evictable, uploads start regardless of keep-local.
    pub local_budget_bytes: u64,
    /// Object tier URL: `file:///dir`, `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix` (anything `object_store::parse_url_opts` parses),
    /// or `memory://` (in-process, tests only).
    pub remote_url: String,
    /// Options for the object store client (e.g. `endpoint`, `region`,
    /// `allow_http`, `access_key_id`, `secret_access_key`), as object_store names them.
    pub remote_options: Vec<(String, String)>,
    /// Retries of one request inside the object store client (transient HTTP
    /// errors), and how long they may take in all; a request that still fails
    /// fails the upload/fetch attempt (uploads are then retried per `retry`).
    pub remote_max_retries: usize,
    pub remote_retry_timeout: Duration,
    /// Chunk PUTs in flight per upload.
    pub upload_concurrency: usize,
    /// Chunk GETs in flight per fetch.
    pub fetch_concurrency: usize,
    /// A streamed checkout (memory served while it is fetched) fails when
    /// one chunk GET gets no complete answer within this long: the restored
    /// process is then stopped and the actor stays suspended, rather than
    /// wait on a stalled object tier.
    pub stream_stall_timeout: Duration,
    /// How long after a streamed checkout is ready (the restore can start)
    /// its background fetch of the chunks nobody asked for starts; the
    /// working set's chunks and those a page fault asks for are fetched at
    /// once. The restore and the process's first answer then do not share
    /// the node's CPU with the bulk of the fetch (decryption,
    /// decompression, writes).
    pub stream_background_delay: Duration,
    /// How long a committed snapshot stays local-only before it is uploaded
    /// (unless the commit says otherwise, or disk pressure, or on demand).
    pub default_keep_local: Duration,
    pub retry: RetryConfig,
    pub chunking: ChunkingConfig,
    /// zstd level of chunk payloads (1 = fast).
    pub zstd_level: i32,
    /// Verify a local copy's files against the manifest's chunk digests at
    /// every checkout (reads and hashes every byte; see docs/STORE.md for the cost).
    pub verify_local_on_checkout: bool,
    /// A local copy whose every byte this daemon hashed (at its commit or a
    /// checkout) less than this long ago, and whose files `stat` the same
    /// since (`local::Fingerprint`), is not hashed again at
    /// checkout. Zero: every checkout hashes it all.
    pub trust_verified_local_for: Duration,
    /// How often the background worker looks for due uploads and evictions
    /// (it is also woken by commits and releases).
    pub scan_interval: Duration,
    /// Run the background uploader/evictor. Off only for tests and tools that
    /// drive uploads explicitly.
    pub background: bool,
    /// Keys sealing the object tier (empty: it holds plaintext). See
    /// `crypto` and docs/STORE.md ("Encryption").
    pub keyring: Keyring,
    /// This node's name in actor leases (see `actor_lease`): unique among the
    /// nodes sharing the object tier.
    pub node_id: String,
    /// How long an actor lease lasts without renewal (renewed every third of
    /// it): after a node dies, its actors can move after this long.
    pub lease_ttl: Duration,
    /// How long a surrender (the actor's pod left this node) waits for its
    /// newest snapshot to become durable, renewing the lease meanwhile;
    /// past it the lease is let go anyway (reported), so the actor can
    /// move on from its newest durable snapshot instead of never.
    pub surrender_timeout: Duration,
    /// How long `latest` waits for a commit of the actor in progress (its
    /// newest generation) before answering `CommitInProgress`.
    pub commit_wait: Duration,
    /// `Some(n)`: each background pass removes the snapshots beyond an
    /// actor's newest `n` that exist on this node alone (local, never
    /// uploaded, not pinned). gc with `keep_newest: n` would collect them
    /// anyway; until it runs they would fill the local tier, and be
    /// uploaded (their keep-local time over, or disk pressure) only to be
    /// collected. `None`: they wait for gc.
    pub prune_keep: Option<usize>,
}

/// Unix milliseconds of a duration, saturating (a duration too long for
/// u64 milliseconds is u64::MAX, never a truncation).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The longest duration the store takes (3650 days): deadlines and
/// expiries computed from it fit in `Instant` and in unix milliseconds.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);
/// The longest actor lease (a node that dies holds its actors this long).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest `stream_background_delay`: the stream must not leave the
/// restored process on the object tier for long.
pub const MAX_STREAM_BACKGROUND_DELAY: Duration = Duration::from_secs(60);

/// The node id when none is configured: `$TORPOR_NODE_ID`, else
/// `/etc/machine-id`, else the host name.
pub fn default_node_id() -> String {
    let env = std::env::var("TORPOR_NODE_ID").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    env.or_else(|| std::fs::read_to_string("/etc/machine-id").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
        .or_else(|| nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()))
        .unwrap_or_else(|| "unnamed-node".to_string())
}

impl StoreConfig {
    pub const DEFAULT_ROOT: &'static str = "/var/lib/torpor/store";
    pub const DEFAULT_REMOTE_URL: &'static str = "file:///var/lib/torpor/objects";

    pub fn new(root: impl Into<PathBuf>) -> Self {
        StoreConfig {
            root: root.into(),
            local_budget_bytes: 20 * 1024 * 1024 * 1024,
            remote_url: Self::DEFAULT_REMOTE_URL.to_string(),
            remote_options: Vec::new(),
            remote_max_retries: 3,
            remote_retry_timeout: Duration::from_secs(30),
            upload_concurrency: 8,
            fetch_concurrency: 16,
            stream_stall_timeout: Duration::from_secs(10),
            stream_background_delay: Duration::from_millis(300),
            default_keep_local: Duration::from_secs(300),
            retry: RetryConfig::default(),
            chunking: ChunkingConfig::default(),
            zstd_level: 1,
            verify_local_on_checkout: true,
            trust_verified_local_for: Duration::from_secs(600),
            scan_interval: Duration::from_secs(5),
            background: true,
            keyring: Keyring::default(),
            node_id: default_node_id(),
            lease_ttl: Duration::from_secs(30),
            surrender_timeout: Duration::from_secs(600),
            commit_wait: Duration::from_secs(20),
            prune_keep: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if !self.root.is_absolute() {
            return bad(format!("root {:?} must be an absolute path", self.root));
        }
        if self.prune_keep == Some(0) {
            return bad("prune_keep must be ≥ 1 (an actor's newest snapshot is never pruned)".into());
        }
        if self.upload_concurrency == 0 || self.upload_concurrency > 256 {
            return bad(format!("upload_concurrency {} must be in 1..=256", self.upload_concurrency));
        }
        if self.stream_stall_timeout.is_zero() {
            return bad("stream_stall_timeout must be more than 0".to_string());
        }
        if self.stream_background_delay > MAX_STREAM_BACKGROUND_DELAY {
            return bad(format!("stream_background_delay {:?} must be at most 60s", self.stream_background_delay));
        }
        if self.fetch_concurrency == 0 || self.fetch_concurrency > 256 {
            return bad(format!("fetch_concurrency {} must be in 1..=256", self.fetch_concurrency));
        }
        if self.retry.initial.is_zero() || self.retry.max < self.retry.initial {
            return bad(format!("retry: initial {:?} must be > 0 and ≤ max {:?}", self.retry.initial, self.retry.max));
        }
        if !(1..=22).contains(&self.zstd_level) {
            return bad(format!("zstd_level {} must be in 1..=22", self.zstd_level));
        }
        if self.scan_interval.is_zero() {
            return bad("scan_interval must be > 0".to_string());
        }
        if self.node_id.is_empty() || self.node_id.len() > 253 || self.node_id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad(format!("node_id {:?} must be 1..=253 characters without spaces or control characters", self.node_id));
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl > MAX_LEASE_TTL {
            return bad(format!("lease_ttl {:?} must be in 1s..=24h", self.lease_ttl));
        }
        if self.surrender_timeout.is_zero() || self.surrender_timeout > MAX_DURATION {
            return bad(format!("surrender_timeout {:?} must be more than 0 and at most 3650 days", self.surrender_timeout));
        }
        for (name, d) in [
            ("keep_local", self.default_keep_local),
            ("retry max", self.retry.max),
            ("scan_interval", self.scan_interval),
            ("remote_retry_timeout", self.remote_retry_timeout),
            ("commit_wait", self.commit_wait),
            ("stream_stall_timeout", self.stream_stall_timeout),
        ] {
            if d > MAX_DURATION {
                return bad(format!("{name} {d:?} is longer than 3650 days"));
            }
        }
        self.chunking.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_capped_with_jitter() {
        let r = RetryConfig { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
        for attempt in 1..40 {
            let full = (Duration::from_millis(100) * 2u32.pow((attempt - 1).min(20))).min(Duration::from_secs(1));
            let d = r.delay(attempt);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?} vs {full:?}");
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = StoreConfig::new("/x");
        c.validate().unwrap();
        c.fetch_concurrency = 0;
        assert!(c.validate().unwrap_err().to_string().contains("fetch_concurrency"));
        let mut c = StoreConfig::new("/x");
        c.stream_background_delay = Duration::from_secs(61);
        assert!(c.validate().unwrap_err().to_string().contains("stream_background_delay"));
        let mut c = StoreConfig::new("rel");
        assert!(c.validate().unwrap_err().to_string().contains("absolute"));
        c.root = "/x".into();
        c.chunking.min = 3;
        assert!(c.validate().unwrap_err().to_string().contains("chunking"));

        // Bounds: nothing that would overflow a deadline or an expiry.
        let mut c = StoreConfig::new("/x");
        c.lease_ttl = Duration::from_secs(u64::MAX);
        assert!(c.validate().unwrap_err().to_string().contains("lease_ttl"));
        let mut c = StoreConfig::new("/x");
        c.default_keep_local = Duration::MAX;
        assert!(c.validate().unwrap_err().to_string().contains("keep_local"));
        let mut c = StoreConfig::new("/x");
        c.surrender_timeout = Duration::ZERO;
        assert!(c.validate().unwrap_err().to_string().contains("surrender_timeout"));
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_secs(u64::MAX)), u64::MAX, "saturates, never truncates");
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
