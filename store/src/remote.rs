//! The object tier: layout and operations over any `object_store`.
//!
//! ```text
//! <prefix>/chunks/sha256/<2 hex>/<64 hex>                      chunk objects (plaintext)
//! <prefix>/chunks/hmac-sha256/<key id>/<2 hex>/<64 hex>        chunk objects sealed under a key
//! <prefix>/actors/<actor>/_gen/<generation:020>/manifest.json  manifests (the commit point)
//! <prefix>/actors/<actor>/lease.json                           the actor lease (one writer per actor)
//! <prefix>/actors/<actor>/_pins/<32 hex>.json                  a checkout elsewhere fetched (fetches) a snapshot of the actor
//! <prefix>/intents/<32 hex>.json                               an upload in progress: the chunks its manifest will name
//! <prefix>/sweeps/<32 hex>.json                                a chunk sweep deleting (announced, with its window)
//! ```

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use url::Url;

use crate::error::{Error, Result};
use crate::id::{ActorName, SnapshotId};

/// The largest manifest object read (sealed or not), and the largest
/// upload intent, checkout pin or sweep announcement (chunk lists as long as
/// a manifest's): a 64 GiB snapshot of 512 KiB chunks has a manifest of
/// about 25 MB.
pub const MAX_MANIFEST_OBJECT_BYTES: u64 = 64 << 20;
/// The largest actor lease object read (they are a few hundred bytes).
pub const MAX_LEASE_OBJECT_BYTES: u64 = 64 << 10;

/// Reads the body of `r` (the object at `path`), refusing it unread when
/// the object tier gives it a size larger than `cap` (and, read, a body
/// longer than `cap`). The body is read as one (`GetResult::bytes`: no
/// copy more than before the cap, on the resume path's chunk GETs); its
/// length is bounded by the size given (HTTP's Content-Length, a file's
/// length when opened).
async fn read_capped(op: &'static str, path: &Path, r: object_store::GetResult, cap: u64) -> Result<Bytes> {
    let too_large = |size: u64| {
        Error::Inconsistent {
        path: path.to_string(),
        detail: format!("{op}: the object is {size} bytes, more than the {cap} bytes such an object may have: refused unread (not this store's, or planted)"),
    }
    };
    if r.meta.size > cap {
        return Err(too_large(r.meta.size));
    }
    let bytes = r.bytes().await.map_err(|e| Error::remote(op, path, e))?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// An actor's lease object as read: its bytes, version, and the object
/// tier's last-modified time of it (unix ms, by the object tier's clock).
pub struct LeaseObject {
    pub bytes: Bytes,
    pub version: ObjectVersion,
    pub last_modified_ms: i64,
    /// Larger than [`MAX_LEASE_OBJECT_BYTES`]: not read (`bytes` empty),
    /// why in words.
    pub too_large: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Remote {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    /// What the remote was opened from (for messages and the DB's remote identity).
    pub url: String,
}

/// A conditional write of an object lost its race: the object was created
/// or changed since it was read.
#[derive(Debug)]
pub struct Precondition;

/// The version of an object read, to update it only if unchanged.
pub type ObjectVersion = object_store::UpdateVersion;
/// A chunk object's name in the object tier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChunkName {
    /// Plaintext: named by the sha256 (hex) of its content.
    Plain(String),
    /// Sealed under `key_id`: named by `Key::chunk_address` of its digest.
    Sealed { key_id: String, address: String },
}

impl ChunkName {
    /// The chunk's name for a snapshot sealed under `key` (or plaintext).
    pub fn of(key: Option<&crate::crypto::Key>, digest: &str) -> ChunkName {
        match key {
            None => ChunkName::Plain(digest.to_string()),
            Some(k) => ChunkName::Sealed { key_id: k.id().to_string(), address: k.chunk_address(digest) },
        }
    }

    /// Key of the database's index of durable chunks (a plain digest, as
    /// before encryption existed, or `hmac-sha256/<key id>/<address>`).
    pub fn index_key(&self) -> String {
        match self {
            ChunkName::Plain(d) => d.clone(),
            ChunkName::Sealed { key_id, address } => format!("hmac-sha256/{key_id}/{address}"),
        }
    }

    /// The name an index key gives (the inverse of [`ChunkName::index_key`]).
    pub fn from_index_key(key: &str) -> Option<ChunkName> {
        match key.split('/').collect::<Vec<_>>().as_slice() {
            [d] if crate::chunk::is_digest(d) => Some(ChunkName::Plain(d.to_string())),
            ["hmac-sha256", key_id, a] if crate::crypto::check_key_id(key_id).is_ok() && crate::chunk::is_digest(a) => {
                Some(ChunkName::Sealed { key_id: key_id.to_string(), address: a.to_string() })
            }
            _ => None,
        }
    }

    /// The key the chunk is sealed under (`None`: plaintext).
    pub fn key_id(&self) -> Option<&str> {
        match self {
            ChunkName::Plain(_) => None,
            ChunkName::Sealed { key_id, .. } => Some(key_id),
        }
    }

    /// The name's hex (object file name).
    pub fn hex(&self) -> &str {
        match self {
            ChunkName::Plain(d) => d,
            ChunkName::Sealed { address, .. } => address,
        }
    }
}

impl std::fmt::Display for ChunkName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkName::Plain(d) => write!(f, "sha256:{d}"),
            ChunkName::Sealed { key_id, address } => write!(f, "hmac-sha256:{address} (key {key_id:?})"),
        }
    }
}

/// Whether the object store honours one kind of conditional write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Honoured {
    Yes,
    /// Refused as not implemented (object_store's `LocalFileSystem` for
    /// updates): the store falls back to a lock that guards one node.
    NotImplemented,
    /// Accepted, but the condition was not enforced.
    Ignored,
}

/// What [`Remote::probe_conditional_writes`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionalWrites {
    /// `If-None-Match: *` (create only if absent): the manifests' commit point.
    pub create: Honoured,
    /// `If-Match: <etag>` (replace only at a version): actor leases.
    pub update: Honoured,
}

/// How a manifest PUT ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ManifestPut {
    Created,
    /// An identical manifest was already there.
    AlreadyThere,
}

/// Whether an endpoint URL is plain http (no TLS: no certificate to check).
fn plain_http(endpoint: Option<String>) -> bool {
    endpoint.is_some_and(|e| e.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://")))
}

/// Builds an object store's client (`build(no_system_certificates)`), as
/// configured. Its HTTP client loads the system's CA certificates when it
/// is made and fails without any, even when it never speaks TLS: when
/// that build fails and the endpoint is plain http (`plain_http`), it is
/// made again without them (any https it meets later, such as a token
/// service, then fails on its certificate). A failure names its causes:
/// the client's own error is only "builder error".
fn build_client<S>(url: &str, plain_http: bool, build: impl Fn(bool) -> Result<object_store::Result<S>>) -> Result<S> {
    let first = match build(false)? {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    if plain_http {
        if let Ok(s) = build(true)? {
            tracing::info!(url, "object store client made without the system's CA certificates (plain http endpoint): {}", causes(&first));
            return Ok(s);
        }
    }
    let mut why = causes(&first);
    if why.contains("CA certificates") {
        why.push_str(
            " (this node has no CA certificates: install them (Debian: ca-certificates), or point SSL_CERT_FILE or SSL_CERT_DIR \
             of torpor-snapshotter at some; an http:// endpoint needs none)",
        );
    }
    Err(Error::InvalidConfig(format!("remote_url {url:?}: {why}")))
}

/// An error and its sources, each once (`a: b: c`).
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

impl Remote {
    /// What [`Remote::open`] checks without creating or contacting
    /// anything: the URL parses, names a supported scheme (`file://`,
    /// `memory://`, `s3://`, `gs://`, `az://`…), and every client option is
    /// one that scheme's client knows.
    pub fn check(url: &str, options: &[(String, String)]) -> Result<()> {
        use object_store::ObjectStoreScheme;
        let bad = |m: String| Error::InvalidConfig(format!("remote_url {url:?}: {m}"));
        let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed)
            .map_err(|e| bad(format!("unsupported scheme {:?} ({e}): use file://, s3://, gs://, az:// or memory://", parsed.scheme())))?;
        Path::parse(path).map_err(|e| bad(e.to_string()))?;
        let opt_err = |k: &str, e: object_store::Error| Error::InvalidConfig(format!("remote option {k:?} for {url:?}: {e}"));
        let no_options = |what: &str| -> Result<()> {
            match options.first() {
                Some((k, _)) => Err(bad(format!("option {k:?} given, but {what} takes no options"))),
                None => Ok(()),
            }
        };
        match scheme {
            ObjectStoreScheme::Local => {
                no_options("a local directory")?;
                parsed.to_file_path().map_err(|()| bad("not a local directory path".into()))?;
            }
            ObjectStoreScheme::Memory => no_options("memory://")?,
            ObjectStoreScheme::AmazonS3 => {
                for (k, _) in options {
                    k.to_ascii_lowercase().parse::<object_store::aws::AmazonS3ConfigKey>().map_err(|e| opt_err(k, e))?;
                }
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                for (k, _) in options {
                    k.to_ascii_lowercase().parse::<object_store::gcp::GoogleConfigKey>().map_err(|e| opt_err(k, e))?;
                }
            }
            ObjectStoreScheme::MicrosoftAzure => {
                for (k, _) in options {
                    k.to_ascii_lowercase().parse::<object_store::azure::AzureConfigKey>().map_err(|e| opt_err(k, e))?;
                }
            }
            _ => return Err(bad("unsupported scheme (use file://, s3://, gs://, az:// or memory://)".into())),
        }
        Ok(())
    }

    /// Open the object store a URL names (see `StoreConfig::remote_url`):
    /// `file:///dir` (created if missing), `memory://`, `s3://`, `gs://`,
    /// `az://`/`abfs://`… with client `options` as object_store names them (an
    /// unknown option is an error, not ignored), on top of the provider's
    /// standard environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`: the
    /// usual way to hand a daemon its credentials). `max_retries` and
    /// `retry_timeout` bound the client's own retries of one request; the
    /// store retries failed uploads on top with its own backoff.
    pub fn open(url: &str, options: &[(String, String)], max_retries: usize, retry_timeout: std::time::Duration) -> Result<Remote> {
        use object_store::ObjectStoreScheme;
        Self::check(url, options)?;
        let bad = |m: String| Error::InvalidConfig(format!("remote_url {url:?}: {m}"));
        let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
        let prefix = Path::parse(path).map_err(|e| bad(e.to_string()))?;
        let retry = object_store::RetryConfig { backoff: Default::default(), max_retries, retry_timeout };
        let opt_err = |k: &str, e: object_store::Error| Error::InvalidConfig(format!("remote option {k:?} for {url:?}: {e}"));
        let no_options = |what: &str| -> Result<()> {
            match options.first() {
                Some((k, _)) => Err(bad(format!("option {k:?} given, but {what} takes no options"))),
                None => Ok(()),
            }
        };
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::Local => {
                no_options("a local directory")?;
                // A directory: keys live under it.
                let dir = parsed.to_file_path().map_err(|()| bad("not a local directory path".into()))?;
                std::fs::create_dir_all(&dir).map_err(|e| Error::io("create object directory", &dir, e))?;
                // Root's alone: the objects are snapshots (process memory).
                // What object_store creates below gets the umask's modes
                // (the daemon's is 077); this directory closes them off.
                {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| Error::io("chmod 0700", &dir, e))?;
                }
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|e| bad(e.to_string()))?;
                return Ok(Remote { store: Arc::new(fs), prefix: Path::default(), url: url.to_string() });
            }
            ObjectStoreScheme::Memory => {
                no_options("memory://")?;
                Arc::new(object_store::memory::InMemory::new())
            }
            ObjectStoreScheme::AmazonS3 => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as Key};
                let configured = || -> Result<AmazonS3Builder> {
                    let mut b = AmazonS3Builder::from_env().with_url(url);
                    for (k, v) in options {
                        b = b.with_config(k.to_ascii_lowercase().parse().map_err(|e| opt_err(k, e))?, v.clone());
                    }
                    Ok(b.with_retry(retry.clone()))
                };
                let b = configured()?;
                let plain = plain_http(b.get_config_value(&Key::S3Endpoint).or_else(|| b.get_config_value(&Key::Endpoint)));
                Arc::new(build_client(url, plain, |no_system_certs| {
                    let b = configured()?;
                    let b = if no_system_certs { b.with_config(Key::Client(ClientConfigKey::NoSystemCertificates), "true") } else { b };
                    Ok(b.build())
                })?)
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url);
                for (k, v) in options {
                    b = b.with_config(k.to_ascii_lowercase().parse().map_err(|e| opt_err(k, e))?, v.clone());
                }
                Arc::new(build_client(url, false, |_| Ok(b.clone().with_retry(retry.clone()).build()))?)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                use object_store::azure::{AzureConfigKey as Key, MicrosoftAzureBuilder};
                let configured = || -> Result<MicrosoftAzureBuilder> {
                    let mut b = MicrosoftAzureBuilder::from_env().with_url(url);
                    for (k, v) in options {
                        b = b.with_config(k.to_ascii_lowercase().parse().map_err(|e| opt_err(k, e))?, v.clone());
                    }
                    Ok(b.with_retry(retry.clone()))
                };
                let b = configured()?;
                // The emulator (Azurite) listens on plain http.
                let emulator = b.get_config_value(&Key::UseEmulator).is_some_and(|v| v == "true");
                let plain = emulator || plain_http(b.get_config_value(&Key::Endpoint));
                Arc::new(build_client(url, plain, |no_system_certs| {
                    let b = configured()?;
                    let b = if no_system_certs { b.with_config(Key::Client(ClientConfigKey::NoSystemCertificates), "true") } else { b };
                    Ok(b.build())
                })?)
            }
            _ => return Err(bad("unsupported scheme (use file://, s3://, gs://, az:// or memory://)".into())),
        };
        Ok(Remote { store, prefix, url: url.to_string() })
    }

    /// Wrap an existing object store (embedding, tests).
    pub fn from_store(store: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> Result<Remote> {
        let prefix = Path::parse(prefix).map_err(|e| Error::InvalidConfig(format!("object prefix {prefix:?}: {e}")))?;
        Ok(Remote { store, prefix, url: url.to_string() })
    }

    fn join(&self, parts: &[&str]) -> Path {
        let mut p = self.prefix.clone();
        for part in parts {
            p = p.clone().join(*part);
        }
        p
    }

    pub fn chunk_path(&self, name: &ChunkName) -> Path {
        match name {
            ChunkName::Plain(d) => self.join(&["chunks", "sha256", &d[..2], d]),
            ChunkName::Sealed { key_id, address } => self.join(&["chunks", "hmac-sha256", key_id, &address[..2], address]),
        }
    }

    fn chunks_root(&self) -> Path {
        self.join(&["chunks"])
    }

    /// `<prefix>/actors/<actor segments…>`
    fn actor_root(&self, actor: &ActorName) -> Path {
        let mut p = self.join(&["actors"]);
        for s in actor.segments() {
            p = p.clone().join(s);
        }
        p
    }

    fn actor_gen_root(&self, actor: &ActorName) -> Path {
        self.actor_root(actor).join("_gen")
    }

    pub fn manifest_path(&self, id: &SnapshotId) -> Path {
        self.actor_gen_root(&id.actor).join(format!("{:020}", id.generation)).join("manifest.json")
    }

    pub fn lease_path(&self, actor: &ActorName) -> Path {
        self.actor_root(actor).join("lease.json")
    }

    /// The actor's lease object (at most [`MAX_LEASE_OBJECT_BYTES`]), if there is one.
    pub async fn get_lease(&self, actor: &ActorName) -> Result<Option<LeaseObject>> {
        let path = self.lease_path(actor);
        match self.store.get(&path).await {
            Ok(r) => {
                let version = ObjectVersion { e_tag: r.meta.e_tag.clone(), version: r.meta.version.clone() };
                let last_modified_ms = r.meta.last_modified.timestamp_millis();
                match read_capped("read lease", &path, r, MAX_LEASE_OBJECT_BYTES).await {
                    Ok(bytes) => Ok(Some(LeaseObject { bytes, version, last_modified_ms, too_large: None })),
                    Err(Error::Inconsistent { detail, .. }) => {
                        Ok(Some(LeaseObject { bytes: Bytes::new(), version, last_modified_ms, too_large: Some(detail) }))
                    }
                    Err(e) => Err(e),
                }
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::remote("get lease", &path, e)),
        }
    }

    /// Writes the actor's lease object: created (`expect` = None: only if
    /// there is none) or replaced (only if still at version `expect`).
    /// `Ok(Err(Precondition))` when another writer got there first.
    /// Object stores without conditional updates (a local directory) are
    /// served by `fallback`: a read-compare-write that guards one node only.
    pub async fn put_lease(
        &self,
        actor: &ActorName,
        bytes: Vec<u8>,
        expect: Option<ObjectVersion>,
        fallback: &tokio::sync::Mutex<()>,
    ) -> Result<std::result::Result<ObjectVersion, Precondition>> {
        let path = self.lease_path(actor);
        let mode = match &expect {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v.clone()),
        };
        let opts = PutOptions { mode, ..Default::default() };
        match self.store.put_opts(&path, PutPayload::from(bytes.clone()), opts).await {
            Ok(r) => Ok(Ok(ObjectVersion { e_tag: r.e_tag, version: r.version })),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(Err(Precondition)),
            // An update of a lease object that was deleted since it was
            // read (some object stores answer 404 to If-Match on a missing
            // key): it changed.
            Err(object_store::Error::NotFound { .. }) if expect.is_some() => Ok(Err(Precondition)),
            Err(object_store::Error::NotImplemented { .. }) => {
                let _one = fallback.lock().await;
                let now = self.get_lease(actor).await?.map(|l| l.version);
                let same = match (&now, &expect) {
                    (Some(n), Some(e)) => n.e_tag == e.e_tag && n.version == e.version,
                    _ => false,
                };
                if !same {
                    return Ok(Err(Precondition));
                }
                let r = self.store.put(&path, PutPayload::from(bytes)).await.map_err(|e| Error::remote("put lease", &path, e))?;
                Ok(Ok(ObjectVersion { e_tag: r.e_tag, version: r.version }))
            }
            Err(e) => Err(Error::remote("put lease", &path, e)),
        }
    }

    /// Try both kinds of conditional write on a probe object
    /// (`<prefix>/probes/<32 hex>.json`, deleted after): a second create of
    /// it must fail, and so must an update at a version it never had.
    pub async fn probe_conditional_writes(&self) -> Result<ConditionalWrites> {
        let path = self.join(&["probes", &format!("{:032x}.json", fastrand::u128(..))]);
        let put = |mode: PutMode| {
            let path = path.clone();
            async move { self.store.put_opts(&path, PutPayload::from_static(b"{}"), PutOptions { mode, ..Default::default() }).await }
        };
        let judge = |r: object_store::Result<object_store::PutResult>| -> Result<Honoured> {
            match r {
                Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => Ok(Honoured::Yes),
                Err(object_store::Error::NotImplemented { .. }) => Ok(Honoured::NotImplemented),
                Ok(_) => Ok(Honoured::Ignored),
                Err(e) => Err(Error::remote("probe conditional writes", &path, e)),
            }
        };
        put(PutMode::Overwrite).await.map_err(|e| Error::remote("probe conditional writes", &path, e))?;
        let res = async {
            let create = judge(put(PutMode::Create).await)?;
            let never = ObjectVersion { e_tag: Some("\"torpor-probe-no-such-version\"".into()), version: None };
            let update = judge(put(PutMode::Update(never)).await)?;
            Ok(ConditionalWrites { create, update })
        }
        .await;
        let _ = self.delete_object("delete conditional-write probe", &path).await;
        res
    }

    /// `<prefix>/intents/<id>.json`: an upload's intent (see `store::guard`).
    pub fn intent_path(&self, id: &str) -> Path {
        self.join(&["intents", &format!("{id}.json")])
    }

    pub fn intents_root(&self) -> Path {
        self.join(&["intents"])
    }

    /// `<prefix>/sweeps/<id>.json`: a sweep's announcement (see `store::guard`).
    pub fn sweep_path(&self, id: &str) -> Path {
        self.join(&["sweeps", &format!("{id}.json")])
    }

    pub fn sweeps_root(&self) -> Path {
        self.join(&["sweeps"])
    }

    /// Write a small object (unconditionally).
    pub async fn put_object(&self, op: &'static str, path: &Path, bytes: Vec<u8>) -> Result<()> {
        self.store.put(path, PutPayload::from(bytes)).await.map_err(|e| Error::remote(op, path, e))?;
        Ok(())
    }

    /// An object's metadata (size, last modified by the object store's
    /// clock), or `None` when there is no such object.
    pub async fn head(&self, op: &'static str, path: &Path) -> Result<Option<object_store::ObjectMeta>> {
        match self.store.head(path).await {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::remote(op, path, e)),
        }
    }

    /// A small object's bytes (an intent, a pin, an announcement: at most
    /// [`MAX_MANIFEST_OBJECT_BYTES`]), or `None` when there is no such object.
    pub async fn get_object(&self, op: &'static str, path: &Path) -> Result<Option<Bytes>> {
        match self.store.get(path).await {
            Ok(r) => Ok(Some(read_capped(op, path, r, MAX_MANIFEST_OBJECT_BYTES).await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::remote(op, path, e)),
        }
    }

    /// Delete an object (absent already: fine).
    pub async fn delete_object(&self, op: &'static str, path: &Path) -> Result<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::remote(op, path, e)),
        }
    }

    /// Every object under `root` (recursively).
    pub async fn list_objects(&self, root: &Path) -> Result<Vec<object_store::ObjectMeta>> {
        self.store.list(Some(root)).try_collect().await.map_err(|e| Error::remote("list", root, e))
    }

    /// Is the chunk object there?
    pub async fn chunk_exists(&self, name: &ChunkName) -> Result<bool> {
        Ok(self.head("check chunk", &self.chunk_path(name)).await?.is_some())
    }

    /// Is the snapshot's manifest there?
    pub async fn manifest_exists(&self, id: &SnapshotId) -> Result<bool> {
        Ok(self.head("check manifest", &self.manifest_path(id)).await?.is_some())
    }

    pub async fn put_chunk(&self, name: &ChunkName, object: Vec<u8>) -> Result<()> {
        let path = self.chunk_path(name);
        self.store.put(&path, PutPayload::from(object)).await.map_err(|e| Error::remote("put chunk", &path, e))?;
        Ok(())
    }

    /// A chunk object of `size` plain bytes (as its manifest says): one
    /// larger than such a chunk can be stored as is refused unread.
    pub async fn get_chunk(&self, name: &ChunkName, size: u32) -> Result<Bytes> {
        let path = self.chunk_path(name);
        let r = self.store.get(&path).await.map_err(|e| Error::remote("get chunk", &path, e))?;
        read_capped("read chunk", &path, r, crate::chunk::max_object_len(size)).await
    }

    pub async fn delete_chunk(&self, name: &ChunkName) -> Result<()> {
        let path = self.chunk_path(name);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::remote("delete chunk", &path, e)),
        }
    }

    /// Write a manifest unless one is there: the commit point of an upload.
    /// An existing identical manifest is success (a retried upload), and so
    /// is one `same` says holds the same manifest (sealed under another
    /// key); a different one is a conflict.
    pub async fn put_manifest(&self, id: &SnapshotId, bytes: Vec<u8>, same: impl Fn(&[u8]) -> bool) -> Result<ManifestPut> {
        let path = self.manifest_path(id);
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&path, PutPayload::from(bytes.clone()), opts).await {
            Ok(_) => Ok(ManifestPut::Created),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get_manifest(id).await? {
                Some(existing) if existing[..] == bytes[..] || same(&existing) => Ok(ManifestPut::AlreadyThere),
                Some(existing) => Err(Error::Conflict {
                    id: id.clone(),
                    detail: format!("{} holds {} bytes with sha256:{}", path, existing.len(), crate::chunk::sha256_hex(&existing)),
                }),
                None => Err(Error::Conflict { id: id.clone(), detail: format!("{path} exists but cannot be read") }),
            },
            Err(e) => Err(Error::remote("put manifest", &path, e)),
        }
    }

    /// The snapshot's manifest object (at most [`MAX_MANIFEST_OBJECT_BYTES`]).
    pub async fn get_manifest(&self, id: &SnapshotId) -> Result<Option<Bytes>> {
        let path = self.manifest_path(id);
        match self.store.get(&path).await {
            Ok(r) => Ok(Some(read_capped("read manifest", &path, r, MAX_MANIFEST_OBJECT_BYTES).await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Error::remote("get manifest", &path, e)),
        }
    }

    pub async fn delete_manifest(&self, id: &SnapshotId) -> Result<()> {
        let path = self.manifest_path(id);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::remote("delete manifest", &path, e)),
        }
    }

    /// Generations of `actor` that have a manifest, ascending.
    pub async fn generations(&self, actor: &ActorName) -> Result<Vec<u64>> {
        let root = self.actor_gen_root(actor);
        let list = self.store.list_with_delimiter(Some(&root)).await.map_err(|e| Error::remote("list", &root, e))?;
        let mut gens: Vec<u64> = list.common_prefixes.iter().filter_map(|p| p.filename().and_then(|f| f.parse().ok())).collect();
        gens.sort_unstable();
        Ok(gens)
    }

    /// Every snapshot with a manifest in the object tier.
    pub async fn all_snapshots(&self) -> Result<Vec<SnapshotId>> {
        Ok(self.actor_objects().await?.0)
    }

    /// Every snapshot with a manifest, and every checkout pin, in the object tier.
    pub async fn actor_objects(&self) -> Result<(Vec<SnapshotId>, Vec<object_store::ObjectMeta>)> {
        let root = self.join(&["actors"]);
        let metas: Vec<_> = self.store.list(Some(&root)).try_collect().await.map_err(|e| Error::remote("list", &root, e))?;
        let mut out = Vec::new();
        let mut pins = Vec::new();
        for m in metas {
            let parts: Vec<String> =
                m.location.prefix_match(&root).map(|it| it.map(|p| p.as_ref().to_string()).collect()).unwrap_or_default();
            let n = parts.len();
            // <actor segments…>/_pins/<id>.json
            if n >= 3 && parts[n - 2] == "_pins" && parts[n - 1].ends_with(".json") && ActorName::new(parts[..n - 2].join("/")).is_ok() {
                pins.push(m);
                continue;
            }
            // <actor segments…>/_gen/<generation>/manifest.json
            if n < 4 || parts[n - 1] != "manifest.json" || parts[n - 3] != "_gen" {
                continue;
            }
            let (Ok(actor), Ok(generation)) = (ActorName::new(parts[..n - 3].join("/")), parts[n - 2].parse::<u64>()) else { continue };
            out.push(SnapshotId::new(actor, generation));
        }
        out.sort();
        Ok((out, pins))
    }

    /// `<prefix>/actors/<actor>/_pins/<id>.json`
    pub fn pin_path(&self, actor: &ActorName, id: &str) -> Path {
        self.actor_root(actor).join("_pins").join(format!("{id}.json"))
    }

    /// The checkout pins of `actor`.
    pub async fn pins(&self, actor: &ActorName) -> Result<Vec<object_store::ObjectMeta>> {
        let root = self.actor_root(actor).join("_pins");
        let list = self.store.list_with_delimiter(Some(&root)).await.map_err(|e| Error::remote("list", &root, e))?;
        Ok(list.objects.into_iter().filter(|m| m.location.filename().is_some_and(|f| f.ends_with(".json"))).collect())
    }

    /// Every chunk object: (name, size, last modified). Objects under
    /// `chunks/` that fit neither layout are left out (never deleted).
    pub async fn all_chunks(&self) -> Result<Vec<(ChunkName, u64, chrono_like::Millis)>> {
        let root = self.chunks_root();
        let metas: Vec<_> = self.store.list(Some(&root)).try_collect().await.map_err(|e| Error::remote("list", &root, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let parts: Vec<String> = m.location.prefix_match(&root)?.map(|p| p.as_ref().to_string()).collect();
                let name = match parts.as_slice() {
                    [alg, pre, hex] if alg == "sha256" && crate::chunk::is_digest(hex) && hex.starts_with(pre.as_str()) => {
                        ChunkName::Plain(hex.clone())
                    }
                    [alg, key_id, pre, hex]
                        if alg == "hmac-sha256"
                            && crate::crypto::check_key_id(key_id).is_ok()
                            && crate::chunk::is_digest(hex)
                            && hex.starts_with(pre.as_str()) =>
                    {
                        ChunkName::Sealed { key_id: key_id.clone(), address: hex.clone() }
                    }
                    _ => return None,
                };
                Some((name, m.size, m.last_modified.timestamp_millis()))
            })
            .collect())
    }
}

pub mod chrono_like {
    /// Unix milliseconds (object last-modified times).
    pub type Millis = i64;
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_CA: &str = "TORPOR_TEST_NO_CA_CERTIFICATES";

    /// S3 through `endpoint`, as the rig's versitygw is configured.
    fn s3(endpoint: &str) -> Result<Remote> {
        let options: Vec<(String, String)> =
            [("endpoint", endpoint), ("allow_http", "true"), ("region", "us-east-1"), ("access_key_id", "k"), ("secret_access_key", "s")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        Remote::open("s3://torpor/objects", &options, 0, std::time::Duration::from_secs(1))
    }

    /// A node without CA certificates (the child below, in an environment
    /// where none is found): a plain http endpoint opens; an https one is
    /// refused naming the cause (it said only "builder error").
    #[test]
    fn an_http_endpoint_needs_no_ca_certificates() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["remote::tests::without_ca_certificates", "--exact", "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(NO_CA, "1")
            .env("SSL_CERT_FILE", "/nonexistent/torpor-test/ca.pem")
            .env("SSL_CERT_DIR", "/nonexistent/torpor-test/certs")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        // With the system's certificates, both open.
        s3("http://127.0.0.1:9").unwrap();
        s3("https://127.0.0.1:9").unwrap();
    }

    #[test]
    #[ignore = "run by an_http_endpoint_needs_no_ca_certificates, in an environment without CA certificates"]
    fn without_ca_certificates() {
        assert!(std::env::var_os(NO_CA).is_some(), "run by an_http_endpoint_needs_no_ca_certificates");
        s3("http://127.0.0.1:9").expect("a plain http endpoint opens without CA certificates");
        s3("HTTP://127.0.0.1:9").expect("the scheme in any case");
        let e = match s3("https://127.0.0.1:9") {
            Ok(_) => panic!("an https endpoint opened without CA certificates"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("No CA certificates were loaded") && e.contains("SSL_CERT_FILE") && e.contains("remote_url"), "{e}");
    }

    #[test]
    fn an_endpoint_is_plain_http_by_its_scheme() {
        assert!(plain_http(Some("http://versitygw:7070".into())));
        assert!(plain_http(Some("HTTP://x".into())));
        assert!(!plain_http(Some("https://s3.amazonaws.com".into())));
        assert!(!plain_http(Some("http".into())));
        assert!(!plain_http(None), "the provider's default endpoint is https");
    }
}
