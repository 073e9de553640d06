//! The shim's control socket, for `torporctl` on the node:
//! `/run/torpor/shims/<shim id>.sock`, in a root-only directory.
//!
//! One JSON request per connection, `{"op": "status" | "suspend" |
//! "resume" | "freeze"}`, answered by one JSON object:
//! `{"ok": true, "shim": ID, "actor": {...}}` or `{"ok": false, "error": "..."}`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use log::{info, warn};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use torpor_runtime::Runtime;

/// Directory of the shims' control sockets.
pub const SOCKET_DIR: &str = "/run/torpor/shims";

/// The control socket of shim `id`.
pub fn socket_path(id: &str) -> PathBuf {
    let dir = std::env::var_os("TORPOR_SHIM_SOCKET_DIR").map(PathBuf::from).unwrap_or_else(|| SOCKET_DIR.into());
    dir.join(format!("{id}.sock"))
}

/// Starts serving; errors are logged (the shim works without it).
pub fn serve(runtime: Runtime, id: String) {
    let path = socket_path(&id);
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            warn!("control socket {path:?}: {e}");
            return;
        }
    };
    info!("control socket at {path:?}");
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let rt = runtime.clone();
                    let id = id.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, &rt, &id).await {
                            warn!("control request: {e}");
                        }
                    });
                }
                Err(e) => warn!("control socket accept: {e}"),
            }
        }
    });
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Removes the socket when the shim exits.
pub fn remove(id: &str) {
    let _ = std::fs::remove_file(socket_path(id));
}

async fn handle(stream: UnixStream, rt: &Runtime, id: &str) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    BufReader::new(r).read_line(&mut line).await?;
    if line.trim().is_empty() {
        return Ok(()); // a liveness probe (torporctl connects, then closes)
    }
    let reply = answer(&line, rt, id).await;
    let mut out = serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    out.push(b'\n');
    w.write_all(&out).await
}

async fn answer(line: &str, rt: &Runtime, id: &str) -> Value {
    let op = match serde_json::from_str::<Value>(line) {
        Ok(v) => v["op"].as_str().unwrap_or_default().to_string(),
        Err(e) => return json!({"ok": false, "error": format!("request is not JSON: {e}")}),
    };
    let result = match op.as_str() {
        "status" => Ok(rt.actor_status().await),
        "suspend" => rt.suspend().await.map(Some),
        "resume" => rt.resume_actor().await.map(Some),
        "freeze" => rt.freeze().await.map(Some),
        other => return json!({"ok": false, "error": format!("unknown op {other:?}: use status, suspend, resume or freeze")}),
    };
    match result {
        Ok(rec) => json!({"ok": true, "shim": id, "actor": rec.map(|r| serde_json::to_value(r).unwrap_or(Value::Null))}),
        Err(e) => json!({"ok": false, "shim": id, "error": e.to_string()}),
    }
}
