//! `torporctl`: the node operator's CLI for torpor actors.
//!
//! It talks to each shim's control socket under `/run/torpor/shims/`
//! (root only). An actor is named by its actor id (`torpor.dev/actor`, by
//! default `<namespace>/<pod>`), by its pod sandbox id, or by the id of one
//! of its containers; unique prefixes of ids (at least 6 characters) work,
//! as with crictl.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

mod snapshots;

const SOCKET_DIR: &str = "/run/torpor/shims";
const STATE_ROOT: &str = "/var/lib/torpor";

#[derive(Parser)]
#[command(name = "torporctl", version, about = "Suspend, resume and inspect torpor actors on this node")]
struct Cli {
    /// Directory of the shims' control sockets.
    #[arg(long, env = "TORPOR_SHIM_SOCKET_DIR", default_value = SOCKET_DIR)]
    socket_dir: PathBuf,
    /// The snapshot store's API socket (torpor-snapshotter).
    #[arg(long, env = "TORPOR_STORE_SOCKET", default_value = torpor_api::STORE_SOCKET)]
    store_socket: PathBuf,
    /// Where torpor keeps actor records (checkpoints kept after a shim died
    /// are listed from there).
    #[arg(long, env = "TORPOR_STATE_ROOT", default_value = STATE_ROOT)]
    state_root: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show actors (all, or the one named).
    Status { actor: Option<String> },
    /// Checkpoint the actor's containers and free their memory.
    Suspend { actor: String },
    /// Restore a suspended actor (or thaw a frozen one).
    Resume { actor: String },
    /// Stop the actor in the cgroup freezer (memory stays resident).
    Freeze { actor: String },
    /// The node's snapshot store: list, inspect, upload, evict, remove, gc.
    #[command(subcommand)]
    Snapshots(snapshots::Cmd),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torporctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    let (op, name) = match &cli.command {
        Command::Snapshots(cmd) => return snapshots::run(&cli.store_socket, cmd, cli.json),
        Command::Status { actor } => ("status", actor.as_deref()),
        Command::Suspend { actor } => ("suspend", Some(actor.as_str())),
        Command::Resume { actor } => ("resume", Some(actor.as_str())),
        Command::Freeze { actor } => ("freeze", Some(actor.as_str())),
    };
    if let Some(n) = name {
        validate_name(n)?;
    }
    let shims = list_shims(&cli.socket_dir)?;
    let mut actors = Vec::new();
    for sock in &shims {
        // A socket nobody listens on is left by a shim that was killed: skip it.
        if UnixStream::connect(sock).is_err() {
            continue;
        }
        match request(sock, "status") {
            Ok(v) if !v["actor"].is_null() => actors.push((sock.clone(), v)),
            Ok(_) => {}
            Err(e) => eprintln!("torporctl: warning: {}: {e}", sock.display()),
        }
    }
    if op == "status" {
        // Checkpoints kept after their shim died: restorable by identity.
        actors.extend(kept_actors(&cli.state_root).into_iter().map(|v| (PathBuf::new(), v)));
    }
    let selected: Vec<&(PathBuf, Value)> = match name {
        None => actors.iter().collect(),
        Some(n) => {
            let m: Vec<_> = actors.iter().filter(|(_, v)| matches(v, n)).collect();
            match m.len() {
                0 if op != "status" && kept_actors(&cli.state_root).iter().any(|v| matches(v, n)) => {
                    return Err(format!(
                        "the shim of {n:?} died: its checkpoint is kept (in the snapshot store) and is restored when a container of the same identity is created"
                    ))
                }
                0 => return Err(format!("no actor named {n:?} on this node (see `torporctl status`)")),
                1 => m,
                k => return Err(format!("{n:?} matches {k} actors: give more of the id")),
            }
        }
    };
    let mut results = Vec::new();
    for (sock, status) in selected {
        if op == "status" {
            results.push(status.clone());
            continue;
        }
        let v = request(sock, op)?;
        if v["ok"] != json!(true) {
            return Err(format!("{op} failed: {}", v["error"].as_str().unwrap_or("unknown error")));
        }
        results.push(v);
    }
    print(&results, cli.json);
    Ok(())
}

/// The records of checkpoints kept after their shim died
/// (`<state root>/actors/*/actor.json` marked `orphaned`), as status
/// entries with `"kept": true`.
fn kept_actors(root: &Path) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(root.join("actors")) else { return Vec::new() };
    let mut v: Vec<Value> = entries
        .flatten()
        .filter_map(|e| {
            let rec: Value = serde_json::from_slice(&std::fs::read(e.path().join("actor.json")).ok()?).ok()?;
            (rec["orphaned"] == json!(true)).then(|| {
                json!({"ok": true, "shim": e.file_name().to_string_lossy(), "kept": true, "actor": rec})
            })
        })
        .collect();
    v.sort_by(|a, b| a["shim"].as_str().cmp(&b["shim"].as_str()));
    v
}

/// Names are actor ids or container/sandbox ids: a restricted charset.
fn validate_name(n: &str) -> Result<(), String> {
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.chars().all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("{n:?} is not an actor or container id (letters, digits, '-', '.', '_', '/')"))
    }
}

fn matches(status: &Value, name: &str) -> bool {
    let actor = &status["actor"];
    if actor["actor"].as_str() == Some(name) {
        return true;
    }
    let prefix = |id: &str| id == name || (name.len() >= 6 && id.starts_with(name));
    status["shim"].as_str().is_some_and(prefix)
        || actor["containers"]
            .as_array()
            .is_some_and(|cs| cs.iter().filter_map(Value::as_str).any(prefix))
}

fn list_shims(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e} (torporctl must run as root)", dir.display())),
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .collect();
    v.sort();
    Ok(v)
}

fn request(sock: &Path, op: &str) -> Result<Value, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect {}: {e}", sock.display()))?;
    // A suspend of a large actor takes seconds; a status answers at once
    // unless that shim is busy or hung, which must not stall the others.
    let limit = if op == "status" { 10 } else { 600 };
    let _ = s.set_read_timeout(Some(Duration::from_secs(limit)));
    writeln!(s, "{}", json!({ "op": op })).map_err(|e| format!("send to {}: {e}", sock.display()))?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| format!("read from {}: {e}", sock.display()))?;
    serde_json::from_str(&line).map_err(|e| format!("bad reply from {}: {e}", sock.display()))
}

fn print(results: &[Value], as_json: bool) {
    if as_json {
        println!("{}", serde_json::to_string_pretty(results).unwrap_or_default());
        return;
    }
    println!("{:<32} {:<11} {:>4} {:>10} {:>10}  {:<14} {:<24} ERROR", "ACTOR", "STATE", "GEN", "SUSPEND_MS", "RESUME_MS", "SHIM", "SNAPSHOT");
    let mut any_kept = false;
    for r in results {
        let a = &r["actor"];
        let ms = |k: &str| a[k].as_u64().map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let shim = r["shim"].as_str().unwrap_or("");
        let kept = r["kept"] == json!(true);
        any_kept |= kept;
        let mut note = a["last_error"].as_str().unwrap_or("").to_string();
        if let Some(from) = a["cloned_from"].as_str() {
            note = format!("cloned from {from} {note}");
        } else if let Some(from) = a["recovered_from"].as_str() {
            note = format!("recovered from {from} {note}");
        }
        // The store snapshot holding the state; "committing" while a
        // suspend's dumps are being committed to the store.
        let snapshot = match (&a["snapshot"], &a["staging"]) {
            (s, _) if s.is_object() => format!("{}@{}", s["actor"].as_str().unwrap_or("?"), s["generation"].as_u64().unwrap_or(0)),
            (_, st) if st.is_object() && a["state"] == json!("SUSPENDED") => "committing".to_string(),
            _ => "-".to_string(),
        };
        println!(
            "{:<32} {:<11} {:>4} {:>10} {:>10}  {:<14} {:<24} {}",
            a["actor"].as_str().unwrap_or("?"),
            a["state"].as_str().unwrap_or("?"),
            a["generation"].as_u64().unwrap_or(0),
            ms("last_suspend_ms"),
            ms("last_resume_ms"),
            format!("{}{}", &shim[..shim.len().min(12)], if kept { "*" } else { "" }),
            snapshot,
            note.trim_end(),
        );
    }
    if any_kept {
        println!("* shim dead: its snapshot stays in the store, and is restored when a container of the same identity is created");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_matching() {
        assert!(validate_name("default/web-0").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a;rm -rf").is_err());
        let st = json!({"shim": "abcdef123456", "actor": {"actor": "default/web", "containers": ["0123456789"]}});
        assert!(matches(&st, "default/web"));
        assert!(matches(&st, "abcdef"));
        assert!(matches(&st, "012345"));
        assert!(!matches(&st, "abc"));
        assert!(!matches(&st, "default/we"));
    }

    #[test]
    fn kept_checkpoints_are_listed() {
        let root = std::env::temp_dir().join(format!("torporctl-test-{}", std::process::id()));
        for (key, orphaned) in [("dead1", true), ("live1", false)] {
            let d = root.join("actors").join(key);
            std::fs::create_dir_all(&d).unwrap();
            let rec = json!({"actor": format!("ns/{key}"), "state": "SUSPENDED", "orphaned": orphaned});
            std::fs::write(d.join("actor.json"), rec.to_string()).unwrap();
        }
        std::fs::create_dir_all(root.join("actors/garbage")).unwrap();
        let kept = kept_actors(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0]["shim"], "dead1");
        assert_eq!(kept[0]["kept"], true);
        assert!(matches(&kept[0], "ns/dead1"));
    }
}
