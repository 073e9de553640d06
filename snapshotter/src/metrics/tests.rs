//! The registry and its exposition: names, types, labels, values.

use std::sync::Arc;
use std::time::Duration;

use super::lifecycle::{Report, TRIGGERS};
use super::*;
use torpor_store::{self as st, ActorName, Observer};

fn report<'a>(actor: &'a str, owner: &'a str, seq: u64, op: &'a str, state: &'a str) -> Report<'a> {
    Report { actor, owner, seq, op, outcome: "ok", state, ..Default::default() }
}

/// The value of the sample `name` (with exactly `labels`, e.g. `{phase="dump"}`) in `text`.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name_and_labels)?;
        let v = rest.strip_prefix(' ')?;
        v.split(' ').next()?.parse().ok()
    })
}

#[test]
fn lifecycle_reports_become_histograms_counters_and_states() {
    let m = Metrics::new(None);
    let l = m.lifecycle();
    let mut r = report("ns/a", "shim-1", 1, "suspend", "suspended");
    r.phases = vec![("freeze", 0.01), ("dump", 0.3), ("fsync", 0.02), ("total", 0.4), ("bogus", 1.0), ("dump", f64::NAN)];
    r.trigger = "idle";
    l.ingest(&r);
    l.ingest(&report("ns/b", "shim-2", 1, "", "running"));
    l.ingest(&Report { reason: "runc", outcome: "failed", ..report("ns/b", "shim-2", 2, "suspend", "running") });
    l.ingest(&Report { reason: "made-up", outcome: "failed", ..report("ns/b", "shim-2", 3, "resume", "") });
    l.ingest(&Report { dropped: 3, ..report("ns/c", "shim-3", 1, "frobnicate", "hovering") });

    let text = m.encode(Format::OpenMetrics).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE torpor_suspend_duration_seconds histogram\n# UNIT torpor_suspend_duration_seconds seconds\n"), "{text}");
    assert!(
        text.contains("# TYPE torpor_suspend_phase_duration_seconds histogram\n# UNIT torpor_suspend_phase_duration_seconds seconds\n"),
        "{text}"
    );
    let phase = |p: &str, what: &str| sample(&text, &format!("torpor_suspend_phase_duration_seconds_{what}{{phase=\"{p}\"}}"));
    assert_eq!(phase("dump", "count"), Some(1.0), "NaN is not observed\n{text}");
    assert_eq!(phase("dump", "sum"), Some(0.3));
    assert_eq!(sample(&text, r#"torpor_suspend_phase_duration_seconds_bucket{le="0.32",phase="dump"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"torpor_suspend_phase_duration_seconds_bucket{le="0.16",phase="dump"}"#), Some(0.0));
    // The total is the operation's own histogram, by trigger: never a phase.
    assert_eq!(phase("total", "count"), None, "{text}");
    assert_eq!(sample(&text, r#"torpor_suspend_duration_seconds_count{trigger="idle"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"torpor_suspend_duration_seconds_sum{trigger="idle"}"#), Some(0.4));
    assert!(!text.contains("torpor_suspend_duration_seconds_count{phase"), "{text}");
    assert!(!text.contains("bogus"), "an unknown phase is not a label\n{text}");
    assert_eq!(sample(&text, r#"torpor_lifecycle_operations_total{op="suspend",outcome="ok"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_lifecycle_operations_total{op="suspend",outcome="failed"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_lifecycle_failures_total{op="suspend",reason="runc"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_lifecycle_failures_total{op="resume",reason="other"}"#), Some(1.0), "unknown reason: other\n{text}");
    assert_eq!(sample(&text, r#"torpor_lifecycle_operations_total{op="other",outcome="ok"}"#), Some(1.0));
    assert_eq!(sample(&text, "torpor_lifecycle_reports_dropped_total"), Some(3.0));
    assert_eq!(sample(&text, r#"torpor_lifecycle_reports_total{result="refused"}"#), Some(1.0), "an unknown state is refused\n{text}");
    // Every state is there, zero or not; actor ids never are.
    assert_eq!(sample(&text, r#"torpor_actors{state="suspended"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"torpor_actors{state="running"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_actors{state="frozen"}"#), Some(0.0));
    assert!(!text.contains("ns/a") && !text.contains("shim-1"), "{text}");
    assert_eq!(sample(&text, r#"torpor_build_info{version=""#.trim_end_matches('"')), None);
    assert!(text.contains(&format!("torpor_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
}

#[test]
fn actor_states_keep_the_newest_report_and_forget_gone_actors() {
    let m = Metrics::new(None);
    let l = m.lifecycle();
    l.ingest(&report("a", "s1", 2, "", "suspending"));
    l.ingest(&report("a", "s1", 1, "", "running")); // older: arrived late
    assert_eq!(l.actors_in("suspending"), 1);
    assert_eq!(l.actors_in("running"), 0);
    l.ingest(&report("a", "s1", 3, "", "suspended"));
    assert_eq!((l.actors_in("suspending"), l.actors_in("suspended")), (0, 1));
    // Another shim's "gone" does not remove the actor; its own does.
    l.ingest(&report("a", "s0", 9, "", "gone"));
    assert_eq!(l.actors_in("suspended"), 1);
    l.ingest(&report("a", "s1", 4, "", "gone"));
    assert_eq!(l.actors_in("suspended"), 0);
    // A new shim of the actor replaces the old one's state whatever its numbers.
    l.ingest(&report("b", "s1", 50, "", "running"));
    l.ingest(&report("b", "s2", 1, "", "frozen"));
    assert_eq!((l.actors_in("running"), l.actors_in("frozen")), (0, 1));
    // A surrendered lease forgets it (of that shim, or of anyone).
    l.forget("b", "s1");
    assert_eq!(l.actors_in("frozen"), 1);
    l.forget("b", "");
    assert_eq!(l.actors_in("frozen"), 0);
}

#[test]
fn store_numbers_and_api_errors_are_exposed_in_both_formats() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = rt.block_on(async {
        let mut cfg = st::StoreConfig::new(tmp.path().join("store"));
        cfg.background = false;
        cfg.local_budget_bytes = 1 << 30;
        let remote = st::Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
        st::Store::open_with_remote(cfg, remote).await.unwrap()
    });
    let m = Metrics::new(Some(&store));
    rt.block_on(async {
        let s = &store;
        s.acquire(&ActorName::new("ns/x").unwrap(), "shim-1").await.unwrap();
        // The same files under two generations, each uploaded: the second
        // upload sends no chunk (dedup).
        for _ in 0..2 {
            let staging = s.begin(&ActorName::new("ns/x").unwrap()).await.unwrap();
            std::fs::write(staging.path.join("pages.img"), vec![7u8; 300_000]).unwrap();
            let info = s.commit(&staging.id, Default::default()).await.unwrap();
            s.upload(&info.id, None).await.unwrap();
        }
    });
    m.api_error("view staging", &st::Error::StagingNotFound("x".into()));
    m.api_error("list (refresh from the object tier)", &st::Error::ShuttingDown);
    m.api_error("no such op", &st::Error::Internal("x".into()));
    m.lifecycle().fetched(Duration::from_millis(20));

    let text = m.encode(Format::OpenMetrics).unwrap();
    let uploaded = sample(&text, "torpor_store_uploaded_bytes_total").unwrap();
    assert!(uploaded > 0.0, "{text}");
    assert!(sample(&text, "torpor_store_uploaded_raw_bytes_total").unwrap() >= 300_000.0);
    assert!(sample(&text, "torpor_store_deduplicated_bytes_total").unwrap() >= 300_000.0, "the second upload reused the chunks\n{text}");
    assert!(sample(&text, "torpor_store_deduplicated_chunks_total").unwrap() >= 1.0);
    assert_eq!(sample(&text, "torpor_store_fetched_bytes_total"), Some(0.0));
    assert!(sample(&text, "torpor_store_local_bytes").unwrap() >= 600_000.0, "{text}");
    assert_eq!(sample(&text, "torpor_store_local_budget_bytes"), Some((1u64 << 30) as f64));
    assert_eq!(sample(&text, "torpor_store_snapshots"), Some(2.0));
    assert_eq!(sample(&text, "torpor_store_pending_uploads"), Some(0.0));
    assert_eq!(sample(&text, "torpor_store_actor_leases"), Some(1.0));
    assert_eq!(sample(&text, "torpor_store_disk_pressure"), Some(0.0));
    assert_eq!(
        sample(&text, r#"torpor_suspend_phase_duration_seconds_count{phase="upload"}"#),
        Some(2.0),
        "the store told of its uploads\n{text}"
    );
    assert_eq!(sample(&text, "torpor_fetch_duration_seconds_count"), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_store_api_errors_total{op="view_staging",kind="not_found"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"torpor_store_api_errors_total{op="list",kind="shutting_down"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"torpor_store_api_errors_total{op="other",kind="internal"}"#), Some(1.0));

    // The classic text format: the same samples, no EOF marker.
    let classic = m.encode(Format::Text).unwrap();
    assert!(!classic.contains("# EOF"));
    assert_eq!(sample(&classic, "torpor_store_uploaded_bytes_total"), Some(uploaded), "{classic}");
    assert!(classic.contains("# TYPE torpor_store_uploaded_bytes_total counter"), "{classic}");
    rt.block_on(store.shutdown());
}

#[test]
fn error_kinds_are_the_documented_ones() {
    let id = || st::SnapshotId::new(ActorName::new("a").unwrap(), 1);
    let errors = [
        st::Error::NotFound(id()),
        st::Error::FetchFailed { id: id(), source: Box::new(st::Error::Corrupt { id: id(), what: "x".into() }) },
        st::Error::FetchFailed { id: id(), source: Box::new(st::Error::Internal("x".into())) },
        st::Error::UploadFailed { id: id(), source: Box::new(st::Error::Internal("x".into())) },
        st::Error::LeaseLost { actor: ActorName::new("a").unwrap(), detail: "x".into() },
    ];
    let kinds: Vec<&str> = errors.iter().map(store::error_kind).collect();
    assert_eq!(kinds, ["not_found", "corrupt", "fetch", "upload", "lease_lost"]);
    let doc = include_str!("../../../docs/METRICS.md");
    for k in store::ERROR_KINDS {
        assert!(doc.contains(&format!("`{k}`")), "docs/METRICS.md does not list the error kind {k}");
    }
    for r in lifecycle::REASONS {
        assert!(doc.contains(&format!("`{r}`")), "docs/METRICS.md does not list the failure class {r}");
    }
}

#[test]
fn accept_header_picks_the_format() {
    assert_eq!(Format::from_accept(None), Format::Text);
    assert_eq!(Format::from_accept(Some("text/plain")), Format::Text);
    let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
}

/// One HTTP/1.1 exchange with the server at `addr`: the whole answer.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(30), c.read_to_string(&mut out)).await.expect("the server closes the connection").unwrap();
    out
}

#[tokio::test]
async fn the_endpoint_serves_metrics_404s_other_paths_and_refuses_other_methods() {
    let m = Metrics::new(None);
    m.lifecycle().ingest(&report("a", "s", 1, "", "suspended"));
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = http::serve(listener, m, stop_rx).unwrap();

    let ok = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("content-type: text/plain; version=0.0.4"), "{ok}");
    assert!(ok.contains("torpor_actors{state=\"suspended\"} 1"), "{ok}");
    let om =
        exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n")
            .await;
    assert!(om.contains("content-type: application/openmetrics-text; version=1.0.0") && om.ends_with("# EOF\n"), "{om}");
    let head = exchange(addr, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200") && !head.contains("torpor_actors"), "{head}");
    let missing = exchange(addr, "GET /metricsx HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    let root = exchange(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(root.starts_with("HTTP/1.1 404"), "{root}");
    let post = exchange(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").await;
    assert!(post.starts_with("HTTP/1.1 405") && post.contains("allow: GET, HEAD"), "{post}");
    // Headers past the limit: refused, the connection closed.
    let huge = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(http::MAX_HEADER_BYTES * 2));
    let big = exchange(addr, &huge).await;
    assert!(big.is_empty() || big.starts_with("HTTP/1.1 431"), "{big}");
    // Garbage: no answer but a closed connection or a 400.
    let junk = exchange(addr, "\x16\x03\x01 not http\r\n\r\n").await;
    assert!(junk.is_empty() || junk.starts_with("HTTP/1.1 400"), "{junk}");

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(30), task).await.expect("the server stops").unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener is closed once stopped");
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let e = http::bind(addr).unwrap_err().to_string();
    assert!(e.contains("metrics_address") && e.contains(&addr.to_string()), "{e}");
}

#[test]
fn totals_go_by_trigger_and_phases_apart() {
    let m = Metrics::new(None);
    let l = m.lifecycle();
    let resume = |seq: u64, trigger: &'static str, phases: Vec<(&'static str, f64)>| Report {
        trigger,
        phases,
        ..report("ns/a", "shim-1", seq, "resume", "running")
    };
    l.ingest(&resume(
        1,
        "connection",
        vec![("prepare", 0.001), ("fetch", 0.02), ("criu_restore", 0.05), ("handover", 0.002), ("total", 0.08)],
    ));
    l.ingest(&resume(2, "connection", vec![("total", 0.004)])); // a thaw: its total only
    l.ingest(&resume(3, "exec", vec![("total", 0.1)]));
    l.ingest(&resume(4, "made-up", vec![("total", 0.1)]));
    l.ingest(&resume(5, "", vec![("total", 0.1)])); // an older shim tells none
    l.ingest(&resume(6, "fence", vec![("total", -1.0), ("total", f64::INFINITY)]));
    // A failed resume is counted, never observed.
    l.ingest(&Report { outcome: "failed", reason: "runc", ..resume(7, "api", vec![("total", 0.5)]) });
    l.ingest(&Report {
        phases: vec![("fetch", 0.2), ("criu_restore", 0.1), ("total", 0.4)],
        ..report("ns/b", "shim-2", 1, "restore", "running")
    });

    let text = m.encode(Format::Text).unwrap();
    let count = |key: &str| sample(&text, key);
    assert_eq!(count(r#"torpor_resume_duration_seconds_count{trigger="connection"}"#), Some(2.0), "{text}");
    assert_eq!(count(r#"torpor_resume_duration_seconds_bucket{trigger="connection",le="0.005"}"#), Some(1.0), "{text}");
    assert_eq!(count(r#"torpor_resume_duration_seconds_count{trigger="exec"}"#), Some(1.0));
    assert_eq!(count(r#"torpor_resume_duration_seconds_count{trigger="other"}"#), Some(2.0), "unknown and untold: other\n{text}");
    assert_eq!(count(r#"torpor_resume_duration_seconds_count{trigger="fence"}"#), None, "no valid duration, no sample\n{text}");
    assert_eq!(count(r#"torpor_resume_duration_seconds_count{trigger="api"}"#), None, "failed: not observed\n{text}");
    assert!(!text.contains("made-up"), "{text}");
    for p in ["prepare", "fetch", "criu_restore", "handover"] {
        assert_eq!(count(&format!("torpor_resume_phase_duration_seconds_count{{phase=\"{p}\"}}")), Some(1.0), "{p}\n{text}");
    }
    assert!(!text.contains(r#"phase="total""#), "total is never a phase\n{text}");
    // The phases of one resume add up to no more than its total.
    let phases: f64 = ["prepare", "fetch", "criu_restore", "handover"]
        .iter()
        .filter_map(|p| count(&format!("torpor_resume_phase_duration_seconds_sum{{phase=\"{p}\"}}")))
        .sum();
    assert!(phases <= 0.08 + 1e-9, "{phases}");
    assert_eq!(count("torpor_restore_duration_seconds_count"), Some(1.0), "{text}");
    assert_eq!(count(r#"torpor_restore_phase_duration_seconds_count{phase="criu_restore"}"#), Some(1.0));
    // Every trigger the shims name is a label value; nothing else is.
    for t in TRIGGERS {
        assert!(t.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{t}");
    }
}

/// Every metric family the daemon exports (`# TYPE` lines of the
/// exposition, with their type), once each has a sample.
fn exported_families() -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = rt.block_on(async {
        let mut cfg = st::StoreConfig::new(tmp.path().join("store"));
        cfg.background = false;
        let remote = st::Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "", "memory://").unwrap();
        st::Store::open_with_remote(cfg, remote).await.unwrap()
    });
    let m = Metrics::new(Some(&store));
    // A family is exposed once it has a sample: one of each.
    let l = m.lifecycle();
    for (op, phases) in [
        ("suspend", vec![("freeze", 0.1), ("total", 0.2)]),
        ("resume", vec![("fetch", 0.1), ("total", 0.2)]),
        ("restore", vec![("criu_restore", 0.1), ("total", 0.2)]),
    ] {
        l.ingest(&Report { phases, trigger: "api", ..report("a", "s", 1, op, "running") });
    }
    l.ingest(&Report { outcome: "failed", reason: "runc", dropped: 1, ..report("a", "s", 2, "resume", "") });
    l.uploaded(Duration::from_millis(1));
    l.fetched(Duration::from_millis(1));
    m.api_error("begin", &st::Error::ShuttingDown);
    let text = m.encode(Format::Text).unwrap();
    rt.block_on(store.shutdown());
    text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(str::to_string).collect()
}

/// The series names a query may use: a histogram's `_bucket`, `_sum`,
/// `_count`, a counter's `_total`, a gauge's name.
fn exported_names() -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for f in exported_families() {
        let (name, kind) = f.split_once(' ').unwrap();
        match kind {
            "histogram" => names.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}"))),
            "counter" => {
                names.insert(format!("{}_total", name.trim_end_matches("_total")));
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

#[test]
fn exported_metric_families_are_listed() {
    let families = exported_families();
    for want in [
        "torpor_resume_duration_seconds histogram",
        "torpor_resume_phase_duration_seconds histogram",
        "torpor_suspend_duration_seconds histogram",
        "torpor_suspend_phase_duration_seconds histogram",
        "torpor_lifecycle_operations_total counter",
        "torpor_store_local_bytes gauge",
        "torpor_store_local_budget_bytes gauge",
        "torpor_actors gauge",
    ] {
        assert!(families.iter().any(|f| f == want), "{want} not in {families:?}");
    }
    let names = exported_names();
    assert!(names.contains("torpor_resume_duration_seconds_bucket") && names.contains("torpor_lifecycle_failures_total"), "{names:?}");
    assert!(!names.contains("torpor_resume_duration_seconds"), "a histogram's own name is no series");
}

/// The metric names in PromQL `expr` that the daemon does not export.
fn unknown_metrics(expr: &str, exported: &std::collections::BTreeSet<String>) -> Vec<String> {
    let re = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*").unwrap();
    // Label values and strings are no metric names.
    let unquoted = regex::Regex::new(r#""(?:[^"\\]|\\.)*""#).unwrap().replace_all(expr, "\"\"");
    re.find_iter(&unquoted).map(|m| m.as_str()).filter(|n| n.starts_with("torpor_") && !exported.contains(*n)).map(str::to_string).collect()
}

/// The deploy's alerts (deploy/observability/torpor-rules.yaml) and
/// dashboard (torpor-dashboard.json) query only series the daemon exports.
#[test]
fn deploy_queries_use_exported_metrics() {
    let exported = exported_names();
    // The check itself: a made-up name and a histogram's bare name are caught.
    assert_eq!(unknown_metrics(r#"rate(torpor_nope_total{op="torpor_x"}[5m]) + torpor_actors"#, &exported), ["torpor_nope_total"]);
    assert_eq!(unknown_metrics("torpor_resume_duration_seconds", &exported), ["torpor_resume_duration_seconds"]);

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability");
    let mut exprs: Vec<(String, String)> = Vec::new();

    // Rules: every `expr:` (one line, or a block scalar's lines).
    let rules = std::fs::read_to_string(dir.join("torpor-rules.yaml")).unwrap();
    let lines: Vec<&str> = rules.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else { continue };
        let indent = line.len() - line.trim_start().len();
        let expr = match rest.trim() {
            "|" | ">" | "|-" | ">-" => lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .copied()
                .collect::<Vec<_>>()
                .join("\n"),
            e => e.to_string(),
        };
        exprs.push((format!("torpor-rules.yaml:{}", i + 1), expr));
    }
    assert!(exprs.len() >= 4, "{exprs:?}");

    // Dashboard: every target's expr and every templating query.
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("torpor-dashboard.json")).unwrap()).unwrap();
    fn walk(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(e)) => out.push((format!("{at}.{k}"), e.clone())),
                        _ => walk(v, &format!("{at}.{k}"), out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| walk(v, &format!("{at}[{i}]"), out)),
            _ => {}
        }
    }
    let before = exprs.len();
    walk(&dash, "dashboard", &mut exprs);
    assert!(exprs.len() - before >= 10, "the dashboard's queries: {exprs:?}");

    for (at, expr) in &exprs {
        assert!(expr.contains("torpor_"), "{at}: no torpor metric in {expr:?}");
        let unknown = unknown_metrics(expr, &exported);
        assert!(unknown.is_empty(), "{at}: {unknown:?} not exported by the daemon (exported: {exported:?}) in {expr}");
    }
}
