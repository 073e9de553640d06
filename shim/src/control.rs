//! The shim's control socket, for `torporctl` and other node components:
//! `/run/torpor/shims/<shim id>.sock` (or under `$TORPOR_SHIM_SOCKET_DIR`),
//! in a root-only directory, serving the typed control API
//! `torpor.control.v1.Control` over ttrpc (api/proto/torpor/control/v1).
//!
//! Each connection's first byte tells its protocol
//! ([`api::Protocol::sniff`]): a ttrpc frame goes to the ttrpc server; the
//! JSON requests of a torporctl older than v1 (`{"op": ...}`), and anything
//! else, are answered with one JSON line saying to upgrade torporctl
//! ([`api::LEGACY_REFUSAL`]) and closed. A connection closed without a byte
//! is a liveness probe.
//!
//! Errors keep their kind on the wire: every runtime error is sent as a
//! ttrpc status with a [`api::Reason`] in its [`api::ErrorDetail`]
//! ([`reason_of`], refined by the actor's state in [`refine`]).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use torpor_api::control as api;
use torpor_api::ttrpc;
use torpor_runtime::actor::{Lifecycle, Record};
use torpor_runtime::{Error, Runtime, StoreErrorKind};
use tracing::{info, warn};

/// How long a connection in the old JSON protocol may take to send its line.
const LEGACY_READ: Duration = Duration::from_secs(5);
/// The most of a JSON request line that is read before the refusal.
const LEGACY_LINE_MAX: u64 = 4096;

/// The control socket of shim `id`.
pub fn socket_path(id: &str) -> PathBuf {
    api::socket_dir().join(format!("{id}.sock"))
}

/// What the control server needs of the runtime: today's `Runtime` methods
/// (see the impl below). Tests serve a fake.
#[async_trait]
pub trait ActorControl: Send + Sync + 'static {
    /// The actor's record; `None` while the shim has no app container.
    async fn status(&self) -> Option<Record>;
    async fn suspend(&self) -> Result<Record, Error>;
    async fn resume(&self) -> Result<Record, Error>;
    async fn freeze(&self) -> Result<Record, Error>;
}

#[async_trait]
impl ActorControl for Runtime {
    async fn status(&self) -> Option<Record> {
        self.actor_status().await
    }
    async fn suspend(&self) -> Result<Record, Error> {
        Runtime::suspend(self).await
    }
    async fn resume(&self) -> Result<Record, Error> {
        self.resume_actor().await
    }
    async fn freeze(&self) -> Result<Record, Error> {
        Runtime::freeze(self).await
    }
}

/// Starts serving; errors are logged (the shim works without it).
pub fn serve(runtime: Runtime, id: String) {
    let path = socket_path(&id);
    match serve_at(&path, runtime, id) {
        Ok(()) => info!("control socket at {path:?} (torpor.control.v1)"),
        Err(e) => warn!("control socket {path:?}: {e}"),
    }
}

/// Binds `path` and serves `actor` on it (in tasks of the current tokio runtime).
fn serve_at<A: ActorControl>(path: &Path, actor: A, id: String) -> std::io::Result<()> {
    let listener = bind(path)?;
    let service = std::sync::Arc::new(Service { actor: std::sync::Arc::new(actor), shim: id.clone() });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<UnixStream>(16);
    let incoming = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|s| s.map(Ok::<_, std::io::Error>)));
    let mut server = ttrpc::asynchronous::Server::new()
        .add_listener(ttrpc::asynchronous::transport::Listener::new(incoming))
        .register_service(api::create_control(service.clone()));
    tokio::spawn(async move {
        if let Err(e) = server.start().await {
            warn!("control socket: ttrpc server: {e}");
            return;
        }
        // The server's tasks run as long as it lives: for the shim's life.
        std::future::pending::<()>().await;
    });
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let tx = tx.clone();
                    let service = service.clone();
                    tokio::spawn(async move {
                        if let Err(e) = route(stream, &tx, &service).await {
                            warn!("control connection: {e}");
                        }
                    });
                }
                Err(e) => {
                    // EMFILE and friends: wait instead of spinning.
                    warn!("control socket accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let ctx = |what: &str, p: &Path, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ctx("create", dir, e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| ctx("chmod 0700", dir, e))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(ctx("remove stale", path, e)),
        _ => {}
    }
    let l = UnixListener::bind(path).map_err(|e| ctx("bind", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| ctx("chmod 0600", path, e))?;
    Ok(l)
}

/// Removes the socket when the shim exits.
pub fn remove(id: &str) {
    let _ = std::fs::remove_file(socket_path(id));
}

/// Does shim `id` still serve (its control socket takes a connection)? A
/// dead shim's socket file refuses it, or is gone.
pub fn serving(id: &str) -> bool {
    std::os::unix::net::UnixStream::connect(socket_path(id)).is_ok()
}

/// The first byte of a connection, without taking it; `None` at EOF.
async fn peek_first(stream: &UnixStream) -> std::io::Result<Option<u8>> {
    loop {
        stream.readable().await?;
        let mut b = [0u8; 1];
        let r = stream.try_io(tokio::io::Interest::READABLE, || {
            nix::sys::socket::recv(stream.as_raw_fd(), &mut b, nix::sys::socket::MsgFlags::MSG_PEEK).map_err(std::io::Error::from)
        });
        match r {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Hands a ttrpc connection to the server; refuses anything else. The
/// first byte has no deadline: a ttrpc client may connect well before its
/// first call (the socket is root's alone).
async fn route<A: ActorControl>(
    stream: UnixStream,
    ttrpc_conns: &tokio::sync::mpsc::Sender<UnixStream>,
    service: &Service<A>,
) -> std::io::Result<()> {
    let Some(first) = peek_first(&stream).await? else {
        return Ok(()); // a liveness probe: connected, then closed
    };
    match api::Protocol::sniff(first) {
        api::Protocol::Ttrpc => ttrpc_conns.send(stream).await.map_err(|_| std::io::Error::other("the ttrpc server has stopped")),
        p => refuse(stream, p, service).await,
    }
}

/// One JSON line to a client that does not speak ttrpc. A torporctl before
/// v1 shows it: as the error of a suspend, resume or freeze (`ok` false),
/// and in its status table (the actor's id, containers and state, with the
/// refusal as its error), so that naming the actor still finds this shim.
async fn refuse<A: ActorControl>(stream: UnixStream, protocol: api::Protocol, service: &Service<A>) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut reader = BufReader::new(r.take(LEGACY_LINE_MAX));
    if protocol == api::Protocol::LegacyJson {
        // Read the request line (bounded, with a deadline) before answering.
        let mut line = Vec::new();
        let _ = tokio::time::timeout(LEGACY_READ, reader.read_until(b'\n', &mut line)).await;
    }
    let mut reply = json!({"ok": false, "error": api::LEGACY_REFUSAL, "api": api::API, "shim": service.shim});
    if let Some(rec) = service.actor.status().await {
        reply["actor"] = json!({
            "actor": rec.actor,
            "state": rec.state.to_string(),
            "generation": rec.generation,
            "containers": rec.containers,
            "last_error": api::LEGACY_REFUSAL,
        });
    }
    info!("control socket: refused a connection that does not speak ttrpc ({protocol:?})");
    let mut out = reply.to_string().into_bytes();
    out.push(b'\n');
    w.write_all(&out).await?;
    w.shutdown().await?;
    // Closing with unread bytes would reset the connection and could lose
    // the answer: drain what the client sends (bounded, with a deadline).
    let _ = tokio::time::timeout(LEGACY_READ, tokio::io::copy(&mut reader, &mut tokio::io::sink())).await;
    Ok(())
}

/// The ttrpc service.
struct Service<A> {
    actor: std::sync::Arc<A>,
    shim: String,
}

#[async_trait]
impl<A: ActorControl> api::Control for Service<A> {
    async fn status(&self, _ctx: &ttrpc::asynchronous::TtrpcContext, _req: api::StatusRequest) -> ttrpc::Result<api::StatusResponse> {
        let mut resp = api::StatusResponse::new();
        resp.api = Some(api::api_version(env!("CARGO_PKG_VERSION"))).into();
        resp.shim = self.shim.clone();
        resp.actor = self.actor.status().await.map(|r| actor_message(&r)).into();
        Ok(resp)
    }

    async fn suspend(&self, _ctx: &ttrpc::asynchronous::TtrpcContext, _req: api::SuspendRequest) -> ttrpc::Result<api::ActorResponse> {
        self.run(Op::Suspend).await
    }

    async fn resume(&self, _ctx: &ttrpc::asynchronous::TtrpcContext, _req: api::ResumeRequest) -> ttrpc::Result<api::ActorResponse> {
        self.run(Op::Resume).await
    }

    async fn freeze(&self, _ctx: &ttrpc::asynchronous::TtrpcContext, _req: api::FreezeRequest) -> ttrpc::Result<api::ActorResponse> {
        self.run(Op::Freeze).await
    }
}

/// A lifecycle operation, and the state it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Suspend,
    Resume,
    Freeze,
}

impl Op {
    fn target(self) -> Lifecycle {
        match self {
            Op::Suspend => Lifecycle::Suspended,
            Op::Resume => Lifecycle::Running,
            Op::Freeze => Lifecycle::Frozen,
        }
    }
}

impl<A: ActorControl> Service<A> {
    /// Runs `op` in a task of its own: ttrpc drops a handler whose caller's
    /// deadline passed, and a suspend or resume must not stop halfway
    /// because its caller stopped waiting. It runs to its end, recorded as
    /// the record says (`torporctl status`).
    async fn run(&self, op: Op) -> ttrpc::Result<api::ActorResponse> {
        let actor = self.actor.clone();
        let task = tokio::spawn(async move {
            match op {
                Op::Suspend => actor.suspend().await,
                Op::Resume => actor.resume().await,
                Op::Freeze => actor.freeze().await,
            }
        });
        match task.await {
            Ok(result) => self.answer(op, result).await,
            Err(e) => Err(api::Failure::new(api::Reason::INTERNAL, format!("the {op:?} task of the shim failed: {e}")).into_ttrpc()),
        }
    }

    async fn answer(&self, op: Op, result: Result<Record, Error>) -> ttrpc::Result<api::ActorResponse> {
        match result {
            Ok(rec) => {
                let mut resp = api::ActorResponse::new();
                resp.shim = self.shim.clone();
                resp.actor = Some(actor_message(&rec)).into();
                Ok(resp)
            }
            Err(e) => {
                let now = self.actor.status().await;
                let reason = refine(op, reason_of(&e), now.as_ref().map(|r| r.state));
                let mut f = api::Failure::new(reason, e.to_string());
                if let Some(rec) = now {
                    f.state = state_message(rec.state);
                    f.actor = rec.actor;
                }
                Err(f.into_ttrpc())
            }
        }
    }
}

/// The reason of a runtime error. Exhaustive on purpose: a new error kind
/// of the runtime must choose its reason here.
///
/// The lease errors of the snapshot store arrive as `FailedPrecondition`
/// with the store's message (torpor-snapshotter's `Error::LeaseLost` and
/// `Error::LeaseHeld`); until the runtime carries them as variants of their
/// own (issue 12, item 4), they are told apart by that message.
pub fn reason_of(e: &Error) -> api::Reason {
    use api::Reason as R;
    match e {
        Error::InvalidAnnotation { .. } | Error::InvalidArgument(_) => R::INVALID_ARGUMENT,
        Error::NotFound(_) => R::NOT_FOUND,
        Error::AlreadyExists(_) => R::WRONG_STATE,
        Error::FailedPrecondition(m) if m.contains("has no actor") => R::NOT_FOUND,
        Error::FailedPrecondition(_) | Error::WrongState(_) => R::WRONG_STATE,
        Error::Store { kind, .. } => match kind {
            StoreErrorKind::LeaseLost => R::LEASE_LOST,
            StoreErrorKind::LeaseHeld => R::LEASE_HELD,
            StoreErrorKind::NotFound => R::NOT_FOUND,
            StoreErrorKind::InvalidArgument => R::INVALID_ARGUMENT,
            StoreErrorKind::Corrupt => R::CORRUPT,
            StoreErrorKind::Unimplemented => R::UNIMPLEMENTED,
            StoreErrorKind::FailedPrecondition => R::WRONG_STATE,
            StoreErrorKind::Unavailable | StoreErrorKind::Other => R::STORE_UNAVAILABLE,
        },
        Error::Corrupt(_) => R::CORRUPT,
        Error::Io { .. } | Error::Sys { .. } | Error::Runc { .. } | Error::Json { .. } => R::INTERNAL,
    }
}

/// A state refusal, made precise by the state the actor is in: already in
/// the state `op` leads to, or in the middle of another transition.
fn refine(op: Op, reason: api::Reason, state: Option<Lifecycle>) -> api::Reason {
    match (reason, state) {
        (api::Reason::WRONG_STATE, Some(s)) if s == op.target() => api::Reason::ALREADY_IN_STATE,
        (api::Reason::WRONG_STATE, Some(Lifecycle::Suspending | Lifecycle::Resuming)) => api::Reason::BUSY,
        (r, _) => r,
    }
}

fn state_message(s: Lifecycle) -> api::State {
    match s {
        Lifecycle::Running => api::State::RUNNING,
        Lifecycle::Frozen => api::State::FROZEN,
        Lifecycle::Suspending => api::State::SUSPENDING,
        Lifecycle::Suspended => api::State::SUSPENDED,
        Lifecycle::Resuming => api::State::RESUMING,
    }
}

fn snapshot_message(s: &torpor_runtime::actor::store_client::SnapshotRef) -> api::SnapshotRef {
    let mut m = api::SnapshotRef::new();
    m.actor = s.actor.clone();
    m.generation = s.generation;
    m
}

/// The actor record as the API carries it.
pub fn actor_message(r: &Record) -> api::Actor {
    let mut a = api::Actor::new();
    a.actor = r.actor.clone();
    a.state = state_message(r.state).into();
    a.generation = r.generation;
    a.containers = r.containers.clone();
    a.last_error = r.last_error.clone();
    a.last_suspend_ms = r.last_suspend_ms;
    a.last_resume_ms = r.last_resume_ms;
    a.names = r.names.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    a.committed_at_ms = r.committed_at_ms;
    a.orphaned = r.orphaned;
    a.recovered_from = r.recovered_from.clone();
    a.moved_from = r.moved_from.clone();
    a.pod_uid = r.pod_uid.clone();
    a.explicit_actor = r.explicit_actor;
    a.staging = r
        .staging
        .as_ref()
        .map(|s| {
            let mut m = api::Staging::new();
            m.id = s.id.clone();
            m.path = s.path.to_string_lossy().into_owned();
            m
        })
        .into();
    a.snapshot = r.snapshot.as_ref().map(snapshot_message).into();
    a.leases = r.leases.clone();
    a.keep_local_s = r.keep_local_s;
    a.restore_snapshot = r.restore_snapshot.as_ref().map(snapshot_message).into();
    a.cloned_from = r.cloned_from.clone();
    a.fenced = r.fenced.clone();
    a.committing = r.committing();
    let phases = |ps: &[torpor_runtime::actor::record::Phase]| {
        ps.iter()
            .map(|p| {
                let mut m = api::Phase::new();
                m.name = p.name.clone();
                m.us = p.us;
                m
            })
            .collect()
    };
    a.last_resume_phases = phases(&r.last_resume_phases);
    a.last_suspend_phases = phases(&r.last_suspend_phases);
    a.last_resume_cpu_us = r.last_resume_cpu_us;
    a.freeze_tier = r
        .freeze_tier
        .filter(|_| r.in_freeze_tier())
        .map(|t| {
            let mut m = api::FreezeTier::new();
            m.since_ms = t.since_ms;
            m.until_ms = t.until_ms;
            m
        })
        .into();
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use torpor_api::protobuf::Message;

    /// A fake actor: its record, and the error the next operation fails with.
    #[derive(Default)]
    struct Fake {
        rec: Mutex<Option<Record>>,
        fail: Mutex<Option<Error>>,
        /// Operations wait for it when set.
        gate: Mutex<Option<std::sync::Arc<tokio::sync::Notify>>>,
    }

    impl Fake {
        async fn op(&self, to: Lifecycle) -> Result<Record, Error> {
            let gate = self.gate.lock().unwrap().clone();
            if let Some(g) = gate {
                g.notified().await;
            }
            if let Some(e) = self.fail.lock().unwrap().take() {
                return Err(e);
            }
            let mut slot = self.rec.lock().unwrap();
            let rec = slot.as_mut().ok_or_else(|| Error::FailedPrecondition("this shim has no actor (no app container)".into()))?;
            rec.state = to;
            Ok(rec.clone())
        }
    }

    #[async_trait]
    impl ActorControl for std::sync::Arc<Fake> {
        async fn status(&self) -> Option<Record> {
            self.rec.lock().unwrap().clone()
        }
        async fn suspend(&self) -> Result<Record, Error> {
            self.op(Lifecycle::Suspended).await
        }
        async fn resume(&self) -> Result<Record, Error> {
            self.op(Lifecycle::Running).await
        }
        async fn freeze(&self) -> Result<Record, Error> {
            self.op(Lifecycle::Frozen).await
        }
    }

    fn record() -> Record {
        let mut r = Record::new("ns/web".into());
        r.generation = 3;
        r.containers = vec!["c0ffee".into()];
        r.snapshot = Some(torpor_runtime::actor::store_client::SnapshotRef { actor: "ns/web".into(), generation: 3 });
        r.last_suspend_ms = Some(120);
        r.fenced = Some("lease unconfirmed".into());
        r
    }

    async fn start(fake: std::sync::Arc<Fake>) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shims").join("shim1.sock");
        serve_at(&path, fake, "shim1".into()).unwrap();
        (dir, path)
    }

    async fn client(path: &Path) -> api::ControlClient {
        let c = ttrpc::asynchronous::Client::connect(&format!("unix://{}", path.display())).await.unwrap();
        api::ControlClient::new(c)
    }

    fn ctx() -> ttrpc::context::Context {
        ttrpc::context::with_timeout(Duration::from_secs(30).as_nanos() as i64)
    }

    fn failure(e: ttrpc::Error) -> api::Failure {
        match e {
            ttrpc::Error::RpcStatus(s) => api::Failure::from_status(&s),
            e => panic!("not a status: {e}"),
        }
    }

    #[tokio::test]
    async fn status_and_operations_over_ttrpc() {
        let fake = std::sync::Arc::new(Fake::default());
        let (_dir, path) = start(fake.clone()).await;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o600);
        let c = client(&path).await;

        // No actor yet: the version and the shim, no record.
        let st = c.status(ctx(), &api::StatusRequest::new()).await.unwrap();
        assert_eq!(st.api.api, api::API);
        assert_eq!(st.api.revision, api::REVISION);
        assert_eq!(st.shim, "shim1");
        assert!(st.actor.is_none());
        let f = failure(c.suspend(ctx(), &api::SuspendRequest::new()).await.unwrap_err());
        assert_eq!((f.reason, f.code), (api::Reason::NOT_FOUND, ttrpc::Code::NOT_FOUND));
        assert!(f.message.contains("no actor"), "{f}");

        *fake.rec.lock().unwrap() = Some(record());
        let st = c.status(ctx(), &api::StatusRequest::new()).await.unwrap();
        let a = st.actor.as_ref().unwrap();
        assert_eq!((a.actor.as_str(), a.generation, a.state.enum_value().unwrap()), ("ns/web", 3, api::State::RUNNING));
        assert_eq!(a.snapshot.generation, 3);
        assert_eq!(a.last_suspend_ms, Some(120));
        assert_eq!(a.last_resume_ms, None);
        assert_eq!(a.fenced.as_deref(), Some("lease unconfirmed"));

        let r = c.freeze(ctx(), &api::FreezeRequest::new()).await.unwrap();
        assert_eq!(r.actor.state.enum_value().unwrap(), api::State::FROZEN);
        let r = c.resume(ctx(), &api::ResumeRequest::new()).await.unwrap();
        assert_eq!((r.shim.as_str(), r.actor.state.enum_value().unwrap()), ("shim1", api::State::RUNNING));
    }

    #[tokio::test]
    async fn errors_keep_their_reason() {
        let fake = std::sync::Arc::new(Fake::default());
        let mut rec = record();
        rec.state = Lifecycle::Suspended;
        *fake.rec.lock().unwrap() = Some(rec);
        let (_dir, path) = start(fake.clone()).await;
        let c = client(&path).await;
        let cases = [
            // A second suspend: already there.
            (Error::WrongState("actor ns/web is SUSPENDED: only a RUNNING or FROZEN actor can be suspended".into()), api::Reason::ALREADY_IN_STATE),
            (Error::store(StoreErrorKind::LeaseLost, "resume of actor ns/web: snapshot store (/run/torpor/store.sock) confirm: actor ns/web: this node no longer holds its lease (node b took it over)"), api::Reason::LEASE_LOST),
            (Error::store(StoreErrorKind::LeaseHeld, "actor ns/web is held by node b (shim x) until 12:00: it runs or is resuming there; refused to run it here too"), api::Reason::LEASE_HELD),
            (Error::store(StoreErrorKind::Unavailable, "the snapshot store socket /run/torpor/store.sock does not exist"), api::Reason::STORE_UNAVAILABLE),
            (Error::Corrupt("digest mismatch".into()), api::Reason::CORRUPT),
            (Error::Runc { command: "checkpoint".into(), message: "criu failed".into() }, api::Reason::INTERNAL),
        ];
        for (e, want) in cases {
            let msg = e.to_string();
            *fake.fail.lock().unwrap() = Some(e);
            let f = failure(c.suspend(ctx(), &api::SuspendRequest::new()).await.unwrap_err());
            assert_eq!(f.reason, want, "{msg}");
            assert_eq!(f.code, want.code(), "{msg}");
            assert_eq!(f.message, msg);
            assert_eq!((f.state, f.actor.as_str()), (api::State::SUSPENDED, "ns/web"));
        }
        // A freeze of a SUSPENDED actor is the wrong state, not "already".
        *fake.fail.lock().unwrap() = Some(Error::FailedPrecondition("actor ns/web is SUSPENDED, not RUNNING".into()));
        let f = failure(c.freeze(ctx(), &api::FreezeRequest::new()).await.unwrap_err());
        assert_eq!(f.reason, api::Reason::WRONG_STATE);
    }

    #[tokio::test]
    async fn an_operation_outlives_its_callers_deadline() {
        let fake = std::sync::Arc::new(Fake::default());
        *fake.rec.lock().unwrap() = Some(record());
        let gate = std::sync::Arc::new(tokio::sync::Notify::new());
        *fake.gate.lock().unwrap() = Some(gate.clone());
        let (_dir, path) = start(fake.clone()).await;
        let c = client(&path).await;
        let short = ttrpc::context::with_timeout(Duration::from_millis(200).as_nanos() as i64);
        let e = c.suspend(short, &api::SuspendRequest::new()).await.unwrap_err();
        // The client's deadline or the server's, whichever is seen first.
        let deadline = match &e {
            ttrpc::Error::RpcStatus(s) => s.code() == ttrpc::Code::DEADLINE_EXCEEDED,
            ttrpc::Error::Others(m) => m.contains("deadline"),
            _ => false,
        };
        assert!(deadline, "{e:?}");
        assert_eq!(fake.rec.lock().unwrap().as_ref().unwrap().state, Lifecycle::Running, "still under way");
        // Past the server's copy of the deadline too (it started later).
        tokio::time::sleep(Duration::from_secs(1)).await;
        gate.notify_one();
        // The suspend goes on to its end though nobody waits for it.
        for _ in 0..600 {
            if fake.rec.lock().unwrap().as_ref().unwrap().state == Lifecycle::Suspended {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the suspend was dropped with its caller");
    }

    /// The freeze tier's FROZEN carries its window; a fence-freeze (or a
    /// plain one) does not.
    #[test]
    fn the_freeze_tier_is_told_apart_in_the_message() {
        use torpor_runtime::actor::record::FreezeTier;
        let mut r = Record::new("ns/web".into());
        r.state = Lifecycle::Frozen;
        r.freeze_tier = Some(FreezeTier { since_ms: 5, until_ms: 30_005 });
        let m = actor_message(&r);
        assert_eq!(m.state.enum_value(), Ok(api::State::FROZEN));
        let t = m.freeze_tier.as_ref().expect("freeze tier");
        assert_eq!((t.since_ms, t.until_ms), (5, 30_005));
        r.fenced = Some("lease lost".into());
        let m = actor_message(&r);
        assert!(m.freeze_tier.is_none() && m.fenced.is_some(), "a fence-freeze is not the freeze tier's");
        r.fenced = None;
        r.state = Lifecycle::Running;
        assert!(actor_message(&r).freeze_tier.is_none());
    }

    #[test]
    fn refusals_refined_by_state() {
        use api::Reason as R;
        assert_eq!(refine(Op::Resume, R::WRONG_STATE, Some(Lifecycle::Running)), R::ALREADY_IN_STATE);
        assert_eq!(refine(Op::Freeze, R::WRONG_STATE, Some(Lifecycle::Frozen)), R::ALREADY_IN_STATE);
        assert_eq!(refine(Op::Suspend, R::WRONG_STATE, Some(Lifecycle::Suspending)), R::BUSY);
        assert_eq!(refine(Op::Resume, R::WRONG_STATE, Some(Lifecycle::Resuming)), R::BUSY);
        assert_eq!(refine(Op::Freeze, R::WRONG_STATE, Some(Lifecycle::Suspended)), R::WRONG_STATE);
        assert_eq!(refine(Op::Suspend, R::WRONG_STATE, None), R::WRONG_STATE);
        // Only state refusals are refined.
        assert_eq!(refine(Op::Suspend, R::LEASE_LOST, Some(Lifecycle::Suspended)), R::LEASE_LOST);
    }

    async fn raw(path: &Path, bytes: &[u8]) -> String {
        let mut s = UnixStream::connect(path).await.unwrap();
        s.write_all(bytes).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut out)).await.unwrap().unwrap();
        out
    }

    #[tokio::test]
    async fn an_old_json_client_is_told_to_upgrade() {
        let fake = std::sync::Arc::new(Fake::default());
        *fake.rec.lock().unwrap() = Some(record());
        let (_dir, path) = start(fake.clone()).await;
        // What torporctl before v1 sent.
        for req in [&b"{\"op\":\"status\"}\n"[..], b"{\"op\":\"suspend\"}\n", b" {\"op\"", b"\n"] {
            let out = raw(&path, req).await;
            assert!(out.ends_with('\n'), "one line: {out:?}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["ok"], false);
            assert_eq!(v["error"], api::LEGACY_REFUSAL);
            assert!(v["error"].as_str().unwrap().contains("upgrade torporctl"));
            // Its status table still shows which actor this shim serves.
            assert_eq!(v["actor"]["actor"], "ns/web");
            assert_eq!(v["actor"]["last_error"], api::LEGACY_REFUSAL);
        }
        assert_eq!(fake.rec.lock().unwrap().as_ref().unwrap().state, Lifecycle::Running, "nothing was acted on");
    }

    #[tokio::test]
    async fn bad_bytes_get_an_error_and_the_server_lives_on() {
        let fake = std::sync::Arc::new(Fake::default());
        *fake.rec.lock().unwrap() = Some(record());
        let (_dir, path) = start(fake.clone()).await;
        // Not ttrpc, not JSON: the refusal line.
        for junk in [&[0xffu8, 0xfe, 0x00, 0x01][..], b"GET / HTTP/1.1\r\n\r\n", &[0x80; 64]] {
            let out = raw(&path, junk).await;
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["error"], api::LEGACY_REFUSAL, "{out}");
        }
        // Looks like ttrpc but is not: a too-long frame, a truncated one,
        // a frame of garbage, a request for an unknown service.
        let mut frames: Vec<Vec<u8>> = vec![
            vec![0x00, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1, 0],
            vec![0x00, 0x00],
            [&[0u8, 0, 0, 8, 0, 0, 0, 1, 1, 0][..], &[0xff; 8]].concat(),
        ];
        let mut req = ttrpc::Request::new();
        req.service = "torpor.control.v0.Control".into();
        req.method = "Status".into();
        let body = req.write_to_bytes().unwrap();
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        f.extend_from_slice(&body);
        frames.push(f);
        // And pseudo-random ones: well-formed headers over random bodies,
        // and random bytes after a leading 0.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..64 {
            let len = (next() % 200) as usize;
            let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let mut f = if i % 2 == 0 {
                let mut h = (len as u32).to_be_bytes().to_vec();
                h.extend_from_slice(&[0, 0, 0, (next() % 8) as u8 * 2 + 1, (next() % 3) as u8, 0]);
                h
            } else {
                vec![0]
            };
            f.extend_from_slice(&body);
            frames.push(f);
        }
        for frame in frames {
            let mut s = UnixStream::connect(&path).await.unwrap();
            s.write_all(&frame).await.unwrap();
            let _ = s.shutdown().await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
        }
        // A liveness probe: connect and close.
        drop(UnixStream::connect(&path).await.unwrap());
        // Still serving, and nothing was acted on.
        let st = client(&path).await.status(ctx(), &api::StatusRequest::new()).await.unwrap();
        assert_eq!(st.actor.state.enum_value().unwrap(), api::State::RUNNING);
    }
}
