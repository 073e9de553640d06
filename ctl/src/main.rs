//! `torporctl`: the node operator's CLI for torpor actors.
//!
//! It talks to each shim's control socket under `/run/torpor/shims/`
//! (root only) in the typed control API torpor.control.v1 (ttrpc; see
//! api/proto/torpor/control/v1/control.proto). An actor is named by its actor id (`torpor.dev/actor`, by
//! default `<namespace>/<pod>`), by its pod sandbox id, or by the id of one
//! of its containers; unique prefixes of ids (at least 6 characters) work,
//! as with crictl.
//!
//! Exit codes: 0 done, 1 failed, 2 usage, 3 not found (no such actor),
//! 4 refused (the actor's state, its lease, a busy transition, a shim of
//! the old protocol).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use torpor_api::ids::ActorId;

mod node;
mod snapshots;

use torporctl::control::{self, list_shims, CallError, Op, Probe};

const STATE_ROOT: &str = "/var/lib/torpor";

#[derive(Parser)]
#[command(name = "torporctl", version, about = "Suspend, resume and inspect torpor actors on this node")]
struct Cli {
    /// Directory of the shims' control sockets (torpor.control.v1, ttrpc).
    #[arg(long, env = torpor_api::control::SOCKET_DIR_ENV, default_value = torpor_api::control::SOCKET_DIR)]
    socket_dir: PathBuf,
    /// The snapshot store's API socket (torpor-snapshotter).
    #[arg(long, env = "TORPOR_STORE_SOCKET", default_value = torpor_api::STORE_SOCKET)]
    store_socket: PathBuf,
    /// Where torpor keeps actor records (checkpoints kept after a shim died
    /// are listed from there).
    #[arg(long, env = "TORPOR_STATE_ROOT", default_value = STATE_ROOT)]
    state_root: PathBuf,
    /// Print JSON instead of a table (same as -o json).
    #[arg(long, global = true)]
    json: bool,
    /// Output: a table (wide: the same, all columns), or JSON.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Output {
    Table,
    Wide,
    Json,
}

impl Cli {
    fn as_json(&self) -> bool {
        self.json || self.output == Output::Json
    }
}

/// Why a command did not do what was asked: its exit code.
#[derive(Debug)]
enum Failure {
    /// 3: what was named does not exist.
    NotFound(String),
    /// 4: refused (the actor's state, its lease, another transition).
    Refused(String),
    /// 1
    Failed(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::NotFound(_) => 3,
            Failure::Refused(_) => 4,
            Failure::Failed(_) => 1,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotFound(m) | Failure::Refused(m) | Failure::Failed(m) => f.write_str(m),
        }
    }
}

impl From<String> for Failure {
    fn from(m: String) -> Failure {
        Failure::Failed(m)
    }
}

/// The exit kind of a shim's refusal reason.
fn failure_of(reason: torpor_api::control::Reason, msg: String) -> Failure {
    use torpor_api::control::Reason as R;
    match reason {
        R::NOT_FOUND => Failure::NotFound(msg),
        R::ALREADY_IN_STATE | R::WRONG_STATE | R::BUSY | R::LEASE_LOST | R::LEASE_HELD => Failure::Refused(msg),
        _ => Failure::Failed(msg),
    }
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
    /// Plumbing of the node installer (deploy/kubernetes/image/node.sh).
    #[command(subcommand, hide = true)]
    Node(node::Cmd),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torporctl: {e}");
            ExitCode::from(e.code())
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let (op, name) = match &cli.command {
        Command::Snapshots(cmd) => return Ok(snapshots::run(&cli.store_socket, &cli.socket_dir, cmd, cli.as_json())?),
        Command::Node(cmd) => return Ok(node::run(cmd)?),
        Command::Status { actor } => (None, actor.as_deref()),
        Command::Suspend { actor } => (Some(Op::Suspend), Some(actor.as_str())),
        Command::Resume { actor } => (Some(Op::Resume), Some(actor.as_str())),
        Command::Freeze { actor } => (Some(Op::Freeze), Some(actor.as_str())),
    };
    if let Some(n) = name {
        validate_name(n)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("start the async runtime: {e}"))?;
    rt.block_on(control_command(cli, op, name))
}

/// A shim found on the node: its socket, and its status entry.
struct Found {
    sock: PathBuf,
    entry: Value,
    /// It speaks the JSON protocol of torpor before v1.
    legacy: bool,
}

async fn control_command(cli: &Cli, op: Option<Op>, name: Option<&str>) -> Result<(), Failure> {
    let shims = list_shims(&cli.socket_dir)?;
    let mut actors = Vec::new();
    for sock in shims {
        match control::status(&sock).await {
            Probe::Status(v) if !v["actor"].is_null() => actors.push(Found { sock, entry: v, legacy: false }),
            Probe::Status(_) | Probe::Dead => {}
            Probe::Legacy(reply) => {
                eprintln!("torporctl: warning: {}: {}", sock.display(), control::LEGACY_SHIM);
                if let Some(v) = reply.filter(|v| !v["actor"].is_null()) {
                    actors.push(Found { sock, entry: v, legacy: true });
                }
            }
            Probe::Failed(e) => eprintln!("torporctl: warning: {}: {e}", sock.display()),
        }
    }
    if op.is_none() {
        // Checkpoints kept after their shim died: restorable by identity.
        // Shims of the old protocol were warned about, not listed.
        actors.retain(|f| !f.legacy);
        actors.extend(kept_actors(&cli.state_root).into_iter().map(|v| Found { sock: PathBuf::new(), entry: v, legacy: false }));
    }
    let selected: Vec<&Found> = match name {
        None => actors.iter().collect(),
        Some(n) => {
            let m: Vec<_> = actors.iter().filter(|f| matches(&f.entry, n)).collect();
            match m.len() {
                0 if op.is_some() && kept_actors(&cli.state_root).iter().any(|v| matches(v, n)) => {
                    return Err(Failure::Refused(format!(
                        "the shim of {n:?} died: its checkpoint is kept (in the snapshot store) and is restored when a container of the same identity is created"
                    )))
                }
                0 => return Err(Failure::NotFound(format!("no actor named {n:?} on this node (see `torporctl status`)"))),
                1 => m,
                k => return Err(Failure::Failed(format!("{n:?} matches {k} actors: give more of the id"))),
            }
        }
    };
    let mut results = Vec::new();
    for found in selected {
        let Some(op) = op else {
            results.push(found.entry.clone());
            continue;
        };
        let who = found.entry["actor"]["actor"].as_str().unwrap_or("?");
        if found.legacy {
            return Err(Failure::Refused(format!(
                "{} of actor {who} refused: {}: {}",
                op.name(),
                found.sock.display(),
                control::LEGACY_SHIM
            )));
        }
        match control::call(&found.sock, op).await {
            Ok(v) => results.push(v),
            Err(CallError::Failed(f)) => {
                return Err(failure_of(f.reason, format!("{} of actor {who} failed ({}): {}", op.name(), f.reason.describe(), f.message)))
            }
            Err(e) => return Err(Failure::Failed(format!("{} of actor {who} failed: {}: {e}", op.name(), found.sock.display()))),
        }
    }
    if cli.as_json() {
        println!("{}", serde_json::to_string_pretty(&results).unwrap_or_default());
    } else {
        print!("{}", table(&results));
    }
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
            (rec["orphaned"] == json!(true))
                .then(|| json!({"ok": true, "shim": e.file_name().to_string_lossy(), "kept": true, "actor": rec}))
        })
        .collect();
    v.sort_by(|a, b| a["shim"].as_str().cmp(&b["shim"].as_str()));
    v
}

/// Longest container or sandbox id (containerd's limit).
const CONTAINER_ID_MAX: usize = 76;

/// A name on the command line is an actor id (the rules of
/// [`torpor_api::ids`]), or a container or sandbox id, or a prefix of one
/// (containerd's identifiers: letters, digits, and '.', '_', '-' between them).
fn validate_name(n: &str) -> Result<(), String> {
    let actor = match ActorId::parse(n) {
        Ok(_) => return Ok(()),
        Err(e) => e,
    };
    let container_id = !n.is_empty()
        && n.len() <= CONTAINER_ID_MAX
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && n.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && !n.contains("..");
    if container_id {
        Ok(())
    } else {
        Err(format!(
            "{n:?} is not an actor id ({}), nor a container or sandbox id (up to {CONTAINER_ID_MAX} letters, digits, '.', '_', '-', starting with a letter or digit)",
            actor.problem
        ))
    }
}

fn matches(status: &Value, name: &str) -> bool {
    let actor = &status["actor"];
    if actor["actor"].as_str() == Some(name) {
        return true;
    }
    let prefix = |id: &str| id == name || (name.len() >= 6 && id.starts_with(name));
    status["shim"].as_str().is_some_and(prefix)
        || actor["containers"].as_array().is_some_and(|cs| cs.iter().filter_map(Value::as_str).any(prefix))
}

/// The first `n` characters of `s` (never a byte slice: names under the
/// state root need not be ASCII).
fn head(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The status table.
fn table(results: &[Value]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:<11} {:>4} {:>10} {:>10}  {:<14} {:<24} ERROR",
        "ACTOR", "STATE", "GEN", "SUSPEND_MS", "RESUME_MS", "SHIM", "SNAPSHOT"
    );
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
        // The freeze tier's FROZEN (a resume thaws it, its window's end
        // checkpoints it) is not the lease fence's nor a plain freeze's.
        let tier = &a["freeze_tier"];
        let state = if a["state"] == json!("FROZEN") && tier.is_object() { "FROZEN-TIER" } else { a["state"].as_str().unwrap_or("?") };
        if let Some(until) = tier["until_ms"].as_u64().filter(|_| state == "FROZEN-TIER") {
            let left = until.saturating_sub(now_ms());
            note = format!("freeze-first: checkpoint in {}.{}s {note}", left / 1000, left % 1000 / 100);
        } else if a["fenced"].is_string() && a["state"] == json!("FROZEN") && !note.contains("lease fence") {
            note = format!("fenced {note}");
        }
        let snapshot = match (&a["snapshot"], &a["staging"]) {
            (s, _) if s.is_object() => format!("{}@{}", s["actor"].as_str().unwrap_or("?"), s["generation"].as_u64().unwrap_or(0)),
            (_, st) if st.is_object() && a["state"] == json!("SUSPENDED") => "committing".to_string(),
            _ => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "{:<32} {:<11} {:>4} {:>10} {:>10}  {:<14} {:<24} {}",
            a["actor"].as_str().unwrap_or("?"),
            state,
            a["generation"].as_u64().unwrap_or(0),
            ms("last_suspend_ms"),
            ms("last_resume_ms"),
            format!("{}{}", head(shim, 12), if kept { "*" } else { "" }),
            snapshot,
            note.trim_end(),
        );
    }
    if any_kept {
        let _ =
            writeln!(out, "* shim dead: its snapshot stays in the store, and is restored when a container of the same identity is created");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_flag_and_exit_codes() {
        let cli = Cli::try_parse_from(["torporctl", "status", "-o", "json"]).unwrap();
        assert!(cli.as_json());
        let cli = Cli::try_parse_from(["torporctl", "--json", "status"]).unwrap();
        assert!(cli.as_json(), "--json stays");
        let cli = Cli::try_parse_from(["torporctl", "-o", "wide", "status"]).unwrap();
        assert!(!cli.as_json() && cli.output == Output::Wide);
        assert!(Cli::try_parse_from(["torporctl", "status", "-o", "yaml"]).is_err());
        use torpor_api::control::Reason as R;
        assert_eq!(failure_of(R::NOT_FOUND, "x".into()).code(), 3);
        for r in [R::WRONG_STATE, R::BUSY, R::LEASE_HELD, R::LEASE_LOST, R::ALREADY_IN_STATE] {
            assert_eq!(failure_of(r, "x".into()).code(), 4, "{r:?}");
        }
        assert_eq!(failure_of(R::INTERNAL, "x".into()).code(), 1);
        assert_eq!(failure_of(R::STORE_UNAVAILABLE, "x".into()).code(), 1);
    }

    #[test]
    fn names_and_matching() {
        assert!(validate_name("default/web-0").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a;rm -rf").is_err());
        // Actor ids follow torpor_api::ids; container ids containerd's rule.
        for ok in ["ns/pod", "0123456789abcdef", "ABCdef-1.2_3", "a"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["a..b", "..", "../x", "a/b/c", "/a", "a/", "-a", "a b", "\u{e9}t\u{e9}", &"a".repeat(254)] {
            let e = validate_name(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")) && e.contains("not an actor id"), "{e}");
        }
        assert!(validate_name("a..b").unwrap_err().contains("\"..\""));
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

    #[test]
    fn status_table_tells_the_freezes_apart() {
        let until = now_ms() + 60_000;
        let rows = vec![
            json!({"shim": "s1", "actor": {"actor": "ns/tier", "state": "FROZEN", "freeze_tier": {"since_ms": 1, "until_ms": until}}}),
            json!({"shim": "s2", "actor": {"actor": "ns/fence", "state": "FROZEN", "fenced": "lease lost", "last_error": "frozen by the lease fence: lease lost"}}),
            json!({"shim": "s3", "actor": {"actor": "ns/plain", "state": "FROZEN"}}),
        ];
        let t = table(&rows);
        let line = |a: &str| t.lines().find(|l| l.starts_with(a)).unwrap_or_default().to_string();
        assert!(line("ns/tier").contains("FROZEN-TIER") && line("ns/tier").contains("freeze-first: checkpoint in "), "{t}");
        assert!(
            line("ns/fence").contains("FROZEN ") && !line("ns/fence").contains("TIER") && line("ns/fence").contains("lease fence"),
            "{t}"
        );
        assert!(line("ns/plain").contains("FROZEN ") && !line("ns/plain").contains("TIER"), "{t}");
    }

    #[test]
    fn status_table_of_non_ascii_names() {
        // issue 14 #13: a name under the state root that is not ASCII
        // (here 13 two-byte characters) used to be cut inside a character.
        let root = tempfile::tempdir().unwrap();
        let key = "\u{e9}".repeat(13);
        let d = root.path().join("actors").join(&key);
        std::fs::create_dir_all(&d).unwrap();
        let rec = json!({"actor": "ns/x", "state": "SUSPENDED", "orphaned": true, "generation": 2});
        std::fs::write(d.join("actor.json"), rec.to_string()).unwrap();
        let kept = kept_actors(root.path());
        assert_eq!(kept.len(), 1);
        let t = table(&kept);
        assert!(t.contains(&format!("{}*", "\u{e9}".repeat(12))), "{t}");
        assert!(!t.contains(&key), "cut to 12 characters: {t}");
        assert_eq!(head("abc", 12), "abc");
        assert_eq!(head("a\u{e9}b", 2), "a\u{e9}");
        assert_eq!(head("", 2), "");
    }
}
