//! `torporctl snapshots ...`: the node's snapshot store, through the store
//! API of torpor-snapshotter (ttrpc on `/run/torpor/store.sock`).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{json, Value};
use torpor_api::ids::{ActorId, SnapshotSelector};
use torpor_api::store as api;
use torpor_api::ttrpc;

/// Every call but the long transfers answers quickly; a hung daemon must not
/// hang the CLI.
const QUICK: Duration = Duration::from_secs(30);
/// Upload of a large snapshot over a slow link.
const TRANSFER: Duration = Duration::from_secs(3600);

#[derive(Subcommand)]
pub enum Cmd {
    /// List snapshots (all, or one actor's), newest last.
    Ls {
        actor: Option<String>,
        /// First import what the object tier holds that this node does not
        /// know yet (e.g. to find every snapshot still sealed under a key).
        #[arg(long)]
        refresh: bool,
    },
    /// Show one snapshot: tiers, sizes, labels and its manifest (ACTOR[@GENERATION], default newest).
    Inspect { snapshot: String },
    /// Upload a snapshot to the object tier now, showing progress.
    ///
    /// ACTOR@GENERATION names one snapshot. ACTOR alone means the actor's
    /// newest committed snapshot; its name is printed first. While a
    /// suspend of the actor on this node is still being committed, ACTOR
    /// alone is refused (naming the generation being committed) instead of
    /// uploading the one before it: wait, or name the generation.
    #[command(verbatim_doc_comment)]
    Upload {
        /// ACTOR (its newest committed snapshot) or ACTOR@GENERATION.
        snapshot: String,
    },
    /// Drop the local copy of a snapshot that is durable in the object tier
    /// (ACTOR@GENERATION, or ACTOR: its newest committed snapshot, refused
    /// while a newer one is being committed on this node).
    Evict { snapshot: String },
    /// Delete a snapshot from both tiers (ACTOR@GENERATION: the generation is required).
    Rm { snapshot: String },
    /// Remove superseded snapshots and unreferenced chunks.
    Gc {
        /// Snapshots to keep per actor (default: the daemon's policy).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        keep: Option<u32>,
        /// Only this actor's snapshots (unreferenced chunks are swept only without it).
        #[arg(long)]
        actor: Option<String>,
    },
    /// The store's budget, usage, pending uploads, transfers and recent errors.
    Status,
}

/// ACTOR (its newest snapshot) or ACTOR@GENERATION, by the rules of
/// [`torpor_api::ids`].
pub type SnapshotRef = SnapshotSelector;

pub fn parse_ref(s: &str) -> Result<SnapshotRef, String> {
    SnapshotSelector::parse(s).map_err(|e| e.to_string())
}

pub fn run(socket: &Path, shim_dir: &Path, cmd: &Cmd, as_json: bool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("start the async runtime: {e}"))?;
    rt.block_on(run_async(socket, shim_dir, cmd, as_json))
}

async fn run_async(socket: &Path, shim_dir: &Path, cmd: &Cmd, as_json: bool) -> Result<(), String> {
    // Check the arguments before connecting.
    let target = match cmd {
        Cmd::Inspect { snapshot } | Cmd::Upload { snapshot } | Cmd::Evict { snapshot } | Cmd::Rm { snapshot } => Some(parse_ref(snapshot)?),
        Cmd::Ls { actor: Some(a), .. } | Cmd::Gc { actor: Some(a), .. } => {
            ActorId::parse(a).map_err(|e| e.to_string())?;
            None
        }
        _ => None,
    };
    if let (Cmd::Rm { snapshot }, Some(SnapshotRef { generation: None, .. })) = (cmd, &target) {
        return Err(format!("rm needs the generation: {snapshot}@<generation> (see `torporctl snapshots ls`)"));
    }
    // "ACTOR" is the newest committed snapshot: while a suspend of the
    // actor on this node is still being committed, that would be the one
    // before it. Refused, naming the generation to wait for.
    if let (Cmd::Upload { .. } | Cmd::Evict { .. }, Some(t)) = (cmd, &target) {
        if t.generation.is_none() {
            if let Some((generation, shim)) = committing(shim_dir, &t.actor).await {
                return Err(format!(
                    "actor {a}'s newest snapshot, {a}@{generation}, is still being committed (shim {shim}): \
                     wait until `torporctl status {a}` shows it under SNAPSHOT, or name the generation (ACTOR@GENERATION)",
                    a = t.actor
                ));
            }
        }
    }
    let client = connect(socket).await?;
    match cmd {
        Cmd::Ls { actor, refresh } => {
            let mut req = api::ListRequest::new();
            req.actor = actor.clone().unwrap_or_default();
            req.refresh = *refresh;
            let resp = client.list(ctx(QUICK), &req).await.map_err(|e| rpc_err("list", e))?;
            print_list(&resp.snapshots, as_json);
        }
        Cmd::Inspect { .. } => {
            let id = resolve(&client, target.as_ref()).await?;
            let resp = client.inspect(ctx(QUICK), &id).await.map_err(|e| rpc_err("inspect", e))?;
            let manifest: Value =
                serde_json::from_str(&resp.manifest_json).map_err(|e| format!("the daemon returned a manifest that is not JSON: {e}"))?;
            let objects: std::collections::BTreeMap<&String, &String> = resp.chunk_objects.iter().collect();
            let out = json!({ "snapshot": info_json(&resp.info), "manifest": manifest, "chunk_objects": objects });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        }
        Cmd::Upload { .. } => {
            let id = resolve(&client, target.as_ref()).await?;
            if target.as_ref().is_some_and(|t| t.generation.is_none()) {
                eprintln!("uploading {} (the newest committed snapshot of {})", name(&id), id.actor);
            }
            let info = with_progress(&client, &id, client.upload(ctx(TRANSFER), &id)).await?;
            print_list(std::slice::from_ref(&info), as_json);
        }
        Cmd::Evict { .. } => {
            let id = resolve(&client, target.as_ref()).await?;
            client.evict(ctx(QUICK), &id).await.map_err(|e| rpc_err("evict", e))?;
            if as_json {
                println!("{}", json!({ "evicted": name(&id) }));
            } else {
                println!("evicted the local copy of {}", name(&id));
            }
        }
        Cmd::Rm { .. } => {
            let id = resolve(&client, target.as_ref()).await?;
            client.remove(ctx(TRANSFER), &id).await.map_err(|e| rpc_err("remove", e))?;
            if as_json {
                println!("{}", json!({ "removed": name(&id) }));
            } else {
                println!("removed {}", name(&id));
            }
        }
        Cmd::Gc { keep, actor } => {
            let mut req = api::GcRequest::new();
            req.keep = keep.unwrap_or(0);
            req.actor = actor.clone().unwrap_or_default();
            let resp = client.gc(ctx(TRANSFER), &req).await.map_err(|e| rpc_err("gc", e))?;
            if as_json {
                let ids = |v: &[api::SnapshotId]| v.iter().map(name).collect::<Vec<_>>();
                let out = json!({"removed": ids(&resp.removed), "kept_pinned": ids(&resp.kept_pinned),
                    "chunks_removed": resp.chunks_removed, "chunks_kept_young": resp.chunks_kept_young,
                    "bytes_freed": resp.bytes_freed, "errors": resp.errors});
                println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            } else {
                for id in &resp.removed {
                    println!("removed {}", name(id));
                }
                for id in &resp.kept_pinned {
                    println!("kept {} (checked out)", name(id));
                }
                println!(
                    "removed {} snapshot(s), {} chunk(s), {}; {} young unreferenced chunk(s) kept",
                    resp.removed.len(),
                    resp.chunks_removed,
                    mib(resp.bytes_freed),
                    resp.chunks_kept_young
                );
                for e in &resp.errors {
                    println!("error: {e}");
                }
            }
            if !resp.errors.is_empty() {
                return Err(format!("gc finished with {} error(s)", resp.errors.len()));
            }
        }
        Cmd::Status => {
            let st = client.status(ctx(QUICK), &api::Empty::new()).await.map_err(|e| rpc_err("status", e))?;
            let transfers: Vec<Value> = st
                .transfers
                .iter()
                .map(|t| json!({"kind": t.kind, "snapshot": t.id.as_ref().map(name), "done_bytes": t.done_bytes, "total_bytes": t.total_bytes}))
                .collect();
            let out = json!({
                "remote_url": st.remote_url,
                "local_budget_bytes": st.local_budget_bytes,
                "local_bytes": st.local_bytes,
                "snapshots": st.snapshots,
                "local_snapshots": st.local_snapshots,
                "pinned_snapshots": st.pinned_snapshots,
                "pending_uploads": st.pending_uploads,
                "disk_pressure": st.disk_pressure,
                "uploaded_bytes": st.uploaded_bytes,
                "uploaded_raw_bytes": st.uploaded_raw_bytes,
                "uploaded_chunks": st.uploaded_chunks,
                "deduplicated_chunks": st.deduplicated_chunks,
                "fetched_bytes": st.fetched_bytes,
                "transfers": transfers,
                "node_id": st.node_id,
                "actor_leases": st.actor_leases,
                "errors": st.errors,
            });
            if as_json {
                println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            } else {
                println!("object tier:     {}", st.remote_url);
                let pressure = if st.disk_pressure { " (DISK PRESSURE: uploading regardless of keep-local)" } else { "" };
                println!("local tier:      {} of {} budget{pressure}", mib(st.local_bytes), mib(st.local_budget_bytes));
                println!("snapshots:       {} ({} local, {} checked out)", st.snapshots, st.local_snapshots, st.pinned_snapshots);
                println!("pending uploads: {}", st.pending_uploads);
                println!(
                    "since start:     uploaded {} in {} chunks ({} deduplicated), fetched {}",
                    mib(st.uploaded_bytes),
                    st.uploaded_chunks,
                    st.deduplicated_chunks,
                    mib(st.fetched_bytes)
                );
                println!("node:            {} ({} actor lease(s) held)", st.node_id, st.actor_leases.len());
                for l in &st.actor_leases {
                    println!("lease            {l}");
                }
                for t in &st.transfers {
                    let id = t.id.as_ref().map(name).unwrap_or_default();
                    println!("{:<8} {id}: {} / {}", t.kind, mib(t.done_bytes), mib(t.total_bytes));
                }
                for e in &st.errors {
                    println!("error: {e}");
                }
            }
        }
    }
    Ok(())
}

async fn connect(socket: &Path) -> Result<api::StoreClient, String> {
    if !socket.exists() {
        return Err(format!("{} does not exist: is torpor-snapshotter running? (systemctl status torpor-snapshotter)", socket.display()));
    }
    let c = ttrpc::asynchronous::Client::connect(&format!("unix://{}", socket.display()))
        .await
        .map_err(|e| format!("connect to the snapshot store at {}: {e} (torporctl must run as root)", socket.display()))?;
    Ok(api::StoreClient::new(c))
}

fn ctx(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(timeout.as_nanos() as i64)
}

fn rpc_err(op: &str, e: ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(s) => format!("{op}: {}", s.message),
        e => format!("{op}: {e}"),
    }
}

/// The generation of `actor` a shim of this node is suspending or
/// committing, and that shim.
async fn committing(shim_dir: &Path, actor: &ActorId) -> Option<(u64, String)> {
    let mut socks: Vec<_> = std::fs::read_dir(shim_dir).ok()?.flatten().map(|e| e.path()).collect();
    socks.retain(|p| p.extension().is_some_and(|x| x == "sock"));
    socks.sort();
    for sock in socks {
        if let torporctl::control::Probe::Status(v) = torporctl::control::status(&sock).await {
            if v["actor"]["actor"].as_str() == Some(actor.as_str()) && is_committing(&v["actor"]) {
                return Some((v["actor"]["generation"].as_u64().unwrap_or(0), v["shim"].as_str().unwrap_or("?").to_string()));
            }
        }
    }
    None
}

/// The record of an actor whose newest generation is not committed yet.
fn is_committing(a: &Value) -> bool {
    a["state"] == "SUSPENDING"
        || a["committing"] == true
        || (a["state"] == "SUSPENDED" && a["staging"].is_object() && !a["snapshot"].is_object())
}

/// The snapshot a reference names; without a generation, the actor's newest.
async fn resolve(client: &api::StoreClient, r: Option<&SnapshotRef>) -> Result<api::SnapshotId, String> {
    let r = r.ok_or("no snapshot given")?;
    let mut id = api::SnapshotId::new();
    id.actor = r.actor.to_string();
    match r.generation {
        Some(g) => id.generation = g,
        None => {
            let mut req = api::LatestRequest::new();
            req.actor = r.actor.to_string();
            let resp = client.latest(ctx(QUICK), &req).await.map_err(|e| rpc_err("latest", e))?;
            let info = resp.info.into_option().ok_or_else(|| format!("actor {:?} has no snapshot", r.actor.as_str()))?;
            id.generation = info.id.generation;
        }
    }
    Ok(id)
}

/// Runs a transfer call while polling the daemon's status for its progress
/// (shown on a terminal only).
async fn with_progress(
    client: &api::StoreClient,
    id: &api::SnapshotId,
    call: impl std::future::Future<Output = ttrpc::Result<api::SnapshotInfo>>,
) -> Result<api::SnapshotInfo, String> {
    let tty = std::io::stderr().is_terminal();
    tokio::pin!(call);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut shown = false;
    loop {
        tokio::select! {
            r = &mut call => {
                if shown {
                    eprintln!();
                }
                return r.map_err(|e| rpc_err("upload", e));
            }
            _ = tick.tick(), if tty => {
                if let Ok(st) = client.status(ctx(QUICK), &api::Empty::new()).await {
                    let t = st.transfers.iter().find(|t| t.id.as_ref().is_some_and(|t| t.actor == id.actor && t.generation == id.generation));
                    if let Some(t) = t {
                        let pct = t.done_bytes.saturating_mul(100).checked_div(t.total_bytes).unwrap_or(0);
                        eprint!("\r{} {}: {} / {} ({pct}%)   ", t.kind, name(id), mib(t.done_bytes), mib(t.total_bytes));
                        let _ = std::io::stderr().flush();
                        shown = true;
                    }
                }
            }
        }
    }
}

fn name(id: &api::SnapshotId) -> String {
    format!("{}@{}", id.actor, id.generation)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn info_json(i: &api::SnapshotInfo) -> Value {
    let labels: HashMap<&String, &String> = i.labels.iter().collect();
    json!({
        "snapshot": i.id.as_ref().map(name),
        "state": i.state,
        "bytes": i.bytes,
        "local": i.local,
        "remote": i.remote,
        "durable": i.durable,
        "created_unix_ms": i.created_unix_ms,
        "last_used_unix_ms": i.last_used_unix_ms,
        "keep_local_until_unix_ms": i.keep_local_until_unix_ms,
        "manifest_digest": i.manifest_digest,
        "chunk_count": i.chunk_count,
        "pins": i.pins,
        "upload_attempts": i.upload_attempts,
        "last_error": i.last_error,
        "key_id": (!i.key_id.is_empty()).then_some(&i.key_id),
        "labels": labels,
    })
}

fn print_list(list: &[api::SnapshotInfo], as_json: bool) {
    if as_json {
        let v: Vec<Value> = list.iter().map(info_json).collect();
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    println!("{:<40} {:<10} {:>12} {:<5} {:<6} {:<7} KEY", "SNAPSHOT", "STATE", "SIZE", "LOCAL", "REMOTE", "DURABLE");
    let yn = |b: bool| if b { "yes" } else { "no" };
    for i in list {
        // The key the object tier's copy is sealed under ("-": none there
        // yet, "none": uploaded unencrypted).
        let key = match (i.remote, i.key_id.as_str()) {
            (false, _) => "-",
            (true, "") => "none",
            (true, k) => k,
        };
        println!(
            "{:<40} {:<10} {:>12} {:<5} {:<6} {:<7} {}",
            i.id.as_ref().map(name).unwrap_or_default(),
            i.state,
            mib(i.bytes),
            yn(i.local),
            yn(i.remote),
            yn(i.durable),
            key
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committing_records() {
        assert!(is_committing(&json!({"state": "SUSPENDING"})));
        assert!(is_committing(&json!({"state": "SUSPENDED", "committing": true})));
        assert!(is_committing(&json!({"state": "SUSPENDED", "staging": {"id": "s"}, "snapshot": null})));
        assert!(!is_committing(&json!({"state": "SUSPENDED", "staging": null, "snapshot": {"actor": "a", "generation": 1}})));
        assert!(!is_committing(&json!({"state": "RUNNING", "committing": false})));
    }

    #[test]
    fn snapshot_refs() {
        let actor = ActorId::parse("default/web").unwrap();
        assert_eq!(parse_ref("default/web").unwrap(), SnapshotRef { actor: actor.clone(), generation: None });
        assert_eq!(parse_ref("default/web@7").unwrap(), SnapshotRef { actor, generation: Some(7) });
        assert!(parse_ref("default/web@").unwrap_err().contains("whole number from 1"));
        for bad in ["default/web@x1", "@3", "a b", "a..b", "a..b@1", "a@0", "a@07", "Default/web"] {
            assert!(parse_ref(bad).unwrap_err().contains(&format!("{bad:?}")), "{bad}");
        }
    }
}
