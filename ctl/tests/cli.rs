//! The `torporctl` binary against fake shims on a private socket directory:
//! one serving torpor.control.v1 (ttrpc), one speaking the JSON protocol of
//! the shims before it; and bad names, non-ASCII state.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;
use torpor_api::control as api;
use torpor_api::ttrpc;

const BIN: &str = env!("CARGO_BIN_EXE_torporctl");

fn torporctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--socket-dir")
        .arg(dir.join("shims"))
        .arg("--state-root")
        .arg(dir.join("state"))
        .arg("--store-socket")
        .arg(dir.join("store.sock"))
        .args(args)
        .env_remove("TORPOR_SHIM_SOCKET_DIR")
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A shim of torpor.control.v1 whose actor `ns/new` is SUSPENDED with
/// generation 5 still committing, and whose resume is refused because
/// another node holds the lease.
struct NewShim;

fn actor() -> api::Actor {
    let mut a = api::Actor::new();
    a.actor = "ns/new".into();
    a.state = api::State::SUSPENDED.into();
    a.generation = 5;
    a.containers = vec!["feedbeef0001".into()];
    let mut st = api::Staging::new();
    st.id = "s5".into();
    a.staging = Some(st).into();
    a.committing = true;
    a
}

#[async_trait::async_trait]
impl api::Control for NewShim {
    async fn status(&self, _: &ttrpc::asynchronous::TtrpcContext, _: api::StatusRequest) -> ttrpc::Result<api::StatusResponse> {
        let mut r = api::StatusResponse::new();
        r.api = Some(api::api_version("test")).into();
        r.shim = "newshim".into();
        r.actor = Some(actor()).into();
        Ok(r)
    }
    async fn resume(&self, _: &ttrpc::asynchronous::TtrpcContext, _: api::ResumeRequest) -> ttrpc::Result<api::ActorResponse> {
        let mut f = api::Failure::new(api::Reason::LEASE_HELD, "actor ns/new is held by node b (shim x) until 12:00");
        f.state = api::State::SUSPENDED;
        Err(f.into_ttrpc())
    }
    async fn freeze(&self, _: &ttrpc::asynchronous::TtrpcContext, _: api::FreezeRequest) -> ttrpc::Result<api::ActorResponse> {
        let mut r = api::ActorResponse::new();
        r.shim = "newshim".into();
        let mut a = actor();
        a.state = api::State::FROZEN.into();
        r.actor = Some(a).into();
        Ok(r)
    }
}

/// Serves [`NewShim`] on `sock` (the runtime must outlive the test's calls).
fn serve_new(sock: &Path) -> (tokio::runtime::Runtime, ttrpc::asynchronous::Server) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _guard = rt.enter();
    let mut server = ttrpc::asynchronous::Server::new()
        .bind(&format!("unix://{}", sock.display()))
        .unwrap()
        .register_service(api::create_control(Arc::new(NewShim)));
    rt.block_on(server.start()).unwrap();
    drop(_guard);
    (rt, server)
}

/// A shim before torpor.control.v1: one JSON line in, one out, per connection.
fn serve_old(sock: &Path) {
    let l = std::os::unix::net::UnixListener::bind(sock).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            let reply = match serde_json::from_str::<Value>(&line) {
                Ok(_) => {
                    r#"{"ok":true,"shim":"oldshim","actor":{"actor":"ns/old","state":"RUNNING","generation":0,"containers":["0ld0ld0ld0ld"]}}"#
                }
                Err(_) => r#"{"ok":false,"error":"request is not JSON"}"#,
            };
            let _ = writeln!(s, "{reply}");
        }
    });
}

#[test]
fn typed_errors_and_old_shims_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let shims = tmp.path().join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    let _new = serve_new(&shims.join("newshim.sock"));
    serve_old(&shims.join("oldshim.sock"));
    // A socket left by a killed shim: skipped without a word.
    drop(std::os::unix::net::UnixListener::bind(shims.join("dead.sock")).unwrap());

    let out = torporctl(tmp.path(), &["--json", "status"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 1, "only the v1 shim's actor is listed: {v}");
    assert_eq!(list[0]["shim"], "newshim");
    assert_eq!(list[0]["actor"]["state"], "SUSPENDED");
    assert_eq!(list[0]["actor"]["generation"], 5);
    assert!(list[0]["actor"]["last_error"].is_null());
    assert!(stderr.contains("oldshim.sock") && stderr.contains("JSON control protocol"), "{stderr}");
    assert!(!stderr.contains("dead.sock"), "{stderr}");

    // The lease held elsewhere: the reason and the shim's message.
    let out = torporctl(tmp.path(), &["resume", "ns/new"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "refused: {stderr}");
    assert!(stderr.contains("another node holds the actor's lease") && stderr.contains("held by node b"), "{stderr}");

    // A method the shim does not implement: UNIMPLEMENTED, said so.
    let out = torporctl(tmp.path(), &["suspend", "newshim"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("suspend of actor ns/new failed (not implemented by this shim)"), "{stderr}");

    let out = torporctl(tmp.path(), &["--json", "freeze", "feedbeef"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["actor"]["state"], "FROZEN");

    // The old shim's actor is found, and the refusal says why.
    let out = torporctl(tmp.path(), &["suspend", "ns/old"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "refused: {stderr}");
    assert!(stderr.contains("suspend of actor ns/old refused") && stderr.contains("older than this torporctl"), "{stderr}");

    // No such actor: not found.
    let out = torporctl(tmp.path(), &["-o", "json", "resume", "ns/nobody"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "not found: {stderr}");
    assert!(stderr.contains("no actor named \"ns/nobody\""), "{stderr}");

    // "ACTOR" while its newest generation is committing: refused, naming it
    // (before the store is asked: there is no store here).
    let out = torporctl(tmp.path(), &["snapshots", "upload", "ns/new"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("ns/new@5") && stderr.contains("still being committed"), "{stderr}");
    let out = torporctl(tmp.path(), &["snapshots", "upload", "ns/new@4"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success() && stderr.contains("store.sock does not exist"), "{stderr}");
}

#[test]
fn bad_names_are_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, bad) in [
        (&["suspend", "a..b"][..], "a..b"),
        (&["status", "../etc"], "../etc"),
        (&["resume", "a;b"], "a;b"),
        (&["snapshots", "inspect", "a..b@1"], "a..b@1"),
        (&["snapshots", "rm", "ns/x@0"], "ns/x@0"),
        (&["snapshots", "ls", "ns/x/y"], "ns/x/y"),
    ] {
        let out = torporctl(tmp.path(), args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{bad:?}")) && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn status_with_non_ascii_names_under_the_state_root() {
    // issue 14 #13: this panicked (exit 134), slicing the name by bytes.
    let tmp = tempfile::tempdir().unwrap();
    let key = "\u{e9}t\u{e9}-\u{1f600}-".repeat(3);
    let d = tmp.path().join("state/actors").join(&key);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("actor.json"), r#"{"actor":"ns/x","state":"SUSPENDED","generation":2,"orphaned":true}"#).unwrap();
    let out = torporctl(tmp.path(), &["status"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let want: String = key.chars().take(12).collect();
    assert!(stdout.contains(&format!("{want}*")) && stdout.contains("ns/x"), "{stdout}");
}
