//! The client of the shims' control API (torpor.control.v1 over ttrpc, on
//! `<socket dir>/<shim id>.sock`).
//!
//! A shim older than torpor.control.v1 spoke one JSON request per
//! connection: when a shim does not answer in ttrpc, it is asked in that
//! JSON protocol once, to say clearly that it is an older shim rather than
//! report a bare transport error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use torpor_api::control as api;
use torpor_api::ttrpc;

/// A status answers at once unless that shim is busy or hung, which must
/// not stall the others.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// A suspend of a large actor takes seconds, a resume from the object tier
/// longer.
pub const OP_TIMEOUT: Duration = Duration::from_secs(600);
/// The JSON question to a shim that did not answer in ttrpc.
const LEGACY_PROBE: Duration = Duration::from_secs(5);

/// A lifecycle operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Suspend,
    Resume,
    Freeze,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Suspend => "suspend",
            Op::Resume => "resume",
            Op::Freeze => "freeze",
        }
    }
}

/// What asking a shim for its status found.
#[derive(Debug)]
pub enum Probe {
    /// A torpor.control.v1 shim: `{"ok": true, "shim": ID, "actor": {...} | null}`.
    Status(Value),
    /// Nobody listens on the socket (left by a shim that was killed).
    Dead,
    /// A shim older than torpor.control.v1 (JSON protocol); its JSON status
    /// reply, if it gave one.
    Legacy(Option<Value>),
    /// Something else went wrong.
    Failed(String),
}

/// Why a call to a shim failed.
#[derive(Debug)]
pub enum CallError {
    /// The shim answered with a failure.
    Failed(api::Failure),
    /// The shim speaks the JSON protocol of torpor before v1.
    Legacy,
    /// Transport or protocol trouble.
    Other(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Failed(fail) => write!(f, "{fail}"),
            CallError::Legacy => f.write_str(LEGACY_SHIM),
            CallError::Other(m) => f.write_str(m),
        }
    }
}

/// What torporctl says of a shim that speaks the JSON protocol.
pub const LEGACY_SHIM: &str = "this shim speaks the JSON control protocol of torpor before torpor.control.v1: \
     it is older than this torporctl (use the torporctl of its version, or recreate its pod under the current shim)";

fn ctx(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(timeout.as_nanos().min(i64::MAX as u128) as i64)
}

async fn connect(sock: &Path) -> Result<api::ControlClient, std::io::Error> {
    // Connect first with tokio: a refused connection (a dead shim's socket)
    // is told apart from one that answers wrongly.
    let stream = tokio::net::UnixStream::connect(sock).await?;
    let socket = ttrpc::asynchronous::transport::Socket::new(stream);
    Ok(api::ControlClient::new(ttrpc::asynchronous::Client::new(socket)))
}

/// Asks the shim on `sock` for its status.
pub async fn status(sock: &Path) -> Probe {
    let client = match connect(sock).await {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) => return Probe::Dead,
        Err(e) => return Probe::Failed(format!("connect: {e} (torporctl must run as root)")),
    };
    match client.status(ctx(STATUS_TIMEOUT), &api::StatusRequest::new()).await {
        Ok(resp) => match check_version(&resp) {
            Ok(()) => Probe::Status(status_json(&resp)),
            Err(e) => Probe::Failed(e),
        },
        Err(e) if is_deadline(&e) => Probe::Failed(format!("no answer within {} s (the shim is busy or hung)", STATUS_TIMEOUT.as_secs())),
        Err(ttrpc::Error::RpcStatus(s)) => {
            let f = api::Failure::from_status(&s);
            if f.reason == api::Reason::UNIMPLEMENTED {
                Probe::Failed(format!("the shim does not serve {} ({})", api::API, f.message))
            } else {
                Probe::Failed(format!("status: {f}"))
            }
        }
        Err(e) => match legacy_probe(sock).await {
            Some(reply) => Probe::Legacy(reply),
            None => Probe::Failed(format!("status: {e}")),
        },
    }
}

/// The shim serves the API this torporctl speaks.
pub fn check_version(resp: &api::StatusResponse) -> Result<(), String> {
    match resp.api.as_ref() {
        Some(v) if v.api == api::API => Ok(()),
        Some(v) => Err(format!("the shim serves {:?}, this torporctl speaks {}", v.api, api::API)),
        None => Err(format!("the shim's status does not say its API version (this torporctl speaks {})", api::API)),
    }
}

/// Runs `op` on the shim on `sock`: `{"ok": true, "shim": ID, "actor": {...}}`.
pub async fn call(sock: &Path, op: Op) -> Result<Value, CallError> {
    let client = connect(sock).await.map_err(|e| CallError::Other(format!("connect {}: {e}", sock.display())))?;
    let c = ctx(OP_TIMEOUT);
    let r = match op {
        Op::Suspend => client.suspend(c, &api::SuspendRequest::new()).await,
        Op::Resume => client.resume(c, &api::ResumeRequest::new()).await,
        Op::Freeze => client.freeze(c, &api::FreezeRequest::new()).await,
    };
    match r {
        Ok(resp) => Ok(json!({"ok": true, "shim": resp.shim, "actor": actor_json(&resp.actor)})),
        Err(e) if is_deadline(&e) => Err(CallError::Other(format!(
            "no answer within {} s: the {} goes on in the shim (see `torporctl status`)",
            OP_TIMEOUT.as_secs(),
            op.name()
        ))),
        Err(ttrpc::Error::RpcStatus(s)) => Err(CallError::Failed(api::Failure::from_status(&s))),
        Err(e) => match legacy_probe(sock).await {
            Some(_) => Err(CallError::Legacy),
            None => Err(CallError::Other(format!("{}: {e}", op.name()))),
        },
    }
}

/// The caller's deadline passed (seen by the client, or by the server).
fn is_deadline(e: &ttrpc::Error) -> bool {
    match e {
        ttrpc::Error::RpcStatus(s) => s.code() == ttrpc::Code::DEADLINE_EXCEEDED,
        ttrpc::Error::Others(m) => m.contains("deadline elapsed"),
        _ => false,
    }
}

/// Asks in the JSON protocol of torpor before v1 (`{"op":"status"}`):
/// `Some` when the shim answers in it (with its reply, unless it is a
/// current shim's refusal).
async fn legacy_probe(sock: &Path) -> Option<Option<Value>> {
    let ask = async {
        let mut s = tokio::net::UnixStream::connect(sock).await.ok()?;
        s.write_all(b"{\"op\":\"status\"}\n").await.ok()?;
        let mut line = Vec::new();
        BufReader::new((&mut s).take(1 << 20)).read_until(b'\n', &mut line).await.ok()?;
        serde_json::from_slice::<Value>(&line).ok()
    };
    let v = tokio::time::timeout(LEGACY_PROBE, ask).await.ok().flatten()?;
    // A current shim refuses JSON naming its API: not a legacy shim (the
    // ttrpc failure was something else).
    if v.get("api").is_some() {
        return None;
    }
    v.get("ok").is_some().then_some(Some(v))
}

fn status_json(resp: &api::StatusResponse) -> Value {
    let actor = resp.actor.as_ref().map(actor_json).unwrap_or(Value::Null);
    json!({"ok": true, "shim": resp.shim, "actor": actor})
}

fn snapshot_json(s: Option<&api::SnapshotRef>) -> Value {
    s.map(|s| json!({"actor": s.actor, "generation": s.generation})).unwrap_or(Value::Null)
}

/// The actor record as torporctl prints it (`--json`): the field names of
/// the shim's record (absent values are null).
pub fn actor_json(a: &api::Actor) -> Value {
    let state = a.state.enum_value().map(|s| s.to_string()).unwrap_or_else(|v| format!("UNKNOWN({v})"));
    json!({
        "actor": a.actor,
        "state": state,
        "generation": a.generation,
        "containers": a.containers,
        "last_error": a.last_error,
        "last_suspend_ms": a.last_suspend_ms,
        "last_resume_ms": a.last_resume_ms,
        "names": a.names,
        "committed_at_ms": a.committed_at_ms,
        "orphaned": a.orphaned,
        "recovered_from": a.recovered_from,
        "moved_from": a.moved_from,
        "pod_uid": a.pod_uid,
        "explicit_actor": a.explicit_actor,
        "staging": a.staging.as_ref().map(|s| json!({"id": s.id, "path": s.path})),
        "snapshot": snapshot_json(a.snapshot.as_ref()),
        "leases": a.leases,
        "keep_local_s": a.keep_local_s,
        "restore_snapshot": snapshot_json(a.restore_snapshot.as_ref()),
        "cloned_from": a.cloned_from,
        "fenced": a.fenced,
        "committing": a.committing,
        "last_resume_phases": phases_json(&a.last_resume_phases),
        "last_suspend_phases": phases_json(&a.last_suspend_phases),
        "last_resume_cpu_us": a.last_resume_cpu_us,
        "freeze_tier": a.freeze_tier.as_ref().map(|t| json!({"since_ms": t.since_ms, "until_ms": t.until_ms})),
    })
}

/// Phases as `[{"name": ..., "us": ...}]`, in order.
fn phases_json(ps: &[api::Phase]) -> Value {
    ps.iter().map(|p| json!({"name": p.name, "us": p.us})).collect()
}

/// The control sockets (`*.sock`) in `dir`, sorted; none when `dir` does
/// not exist.
pub fn list_shims(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e} (torporctl must run as root)", dir.display())),
    };
    let mut v: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "sock")).collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_records_keep_their_json_shape() {
        let mut a = api::Actor::new();
        a.actor = "ns/web".into();
        a.state = api::State::SUSPENDED.into();
        a.generation = 4;
        a.containers = vec!["c1".into()];
        let mut s = api::SnapshotRef::new();
        s.actor = "ns/web".into();
        s.generation = 4;
        a.snapshot = Some(s).into();
        a.last_suspend_ms = Some(80);
        let v = actor_json(&a);
        assert_eq!(v["state"], "SUSPENDED");
        assert_eq!(v["snapshot"], json!({"actor": "ns/web", "generation": 4}));
        assert_eq!(v["last_suspend_ms"], 80);
        for absent in [
            "last_error",
            "last_resume_ms",
            "staging",
            "fenced",
            "cloned_from",
            "recovered_from",
            "moved_from",
            "restore_snapshot",
            "freeze_tier",
        ] {
            assert!(v[absent].is_null(), "{absent}: {v}");
        }
        let mut t = api::FreezeTier::new();
        t.since_ms = 1_000;
        t.until_ms = 31_000;
        a.state = api::State::FROZEN.into();
        a.freeze_tier = Some(t).into();
        assert_eq!(actor_json(&a)["freeze_tier"], json!({"since_ms": 1_000, "until_ms": 31_000}));
        // A state added after this build is shown, not hidden.
        a.state = torpor_api::protobuf::EnumOrUnknown::from_i32(42);
        assert_eq!(actor_json(&a)["state"], "UNKNOWN(42)");
    }

    #[test]
    fn versions_are_checked() {
        let mut resp = api::StatusResponse::new();
        assert!(check_version(&resp).unwrap_err().contains("does not say"));
        let mut v = api::api_version("0.1.0");
        resp.api = Some(v.clone()).into();
        assert!(check_version(&resp).is_ok());
        v.api = "torpor.control.v2".into();
        resp.api = Some(v).into();
        let e = check_version(&resp).unwrap_err();
        assert!(e.contains("torpor.control.v2") && e.contains(api::API), "{e}");
    }
}
