//! The node daemon's Prometheus metrics (docs/METRICS.md), scraped from the
//! rig's torpor-snapshotter (`metrics_address` in its config, written by
//! test/rig/up.sh): a suspend and a resume (from the object tier, after
//! an upload and an eviction) move the lifecycle histograms (the whole
//! operation's by `trigger`, its phases in a histogram of their own), the
//! byte counters and the actors by state; a resume woken by a connection
//! counts as `trigger="connection"`; the exposition passes `promtool check
//! metrics` (built by `make deps`, scripts/deps.sh promtool).
//!
//! The daemon is the node's: other tests' actors count too, so every check
//! is that a number went up (or that at least one actor is in a state),
//! never an exact value. torpor-only.

use torpor_tests::metrics::{get, samples, scrape, value};
use torpor_tests::*;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("${name} is not set: run the tests through test/rig/run-tests.sh"))
}

/// `metrics_address` of node A's torpor-snapshotter, from its config file.
fn metrics_address() -> String {
    metrics::address_in(&env("TORPOR_RIG_SNAPSHOTTER_CONFIG"))
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn suspend_and_resume_move_the_metrics_and_promtool_accepts_them() {
    torpor_only();
    let addr = metrics_address();
    let promtool = "/usr/local/bin/promtool";
    assert!(std::path::Path::new(promtool).exists(), "{promtool} missing: make deps (scripts/deps.sh promtool) builds it");
    let before = scrape(&addr);
    // The whole operation's count, by trigger; a phase's count.
    let total = |what: &str, trigger: &str| format!("torpor_{what}_duration_seconds_count{{trigger=\"{trigger}\"}}");
    let count = |phase: &str, what: &str| format!("torpor_{what}_phase_duration_seconds_count{{phase=\"{phase}\"}}");

    // Memory of its own pattern (--seed, a number): chunks no other
    // snapshot has, so that the upload sends them.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    let c = CounterSpec::new().alloc_mib(16).seed(&seed.to_string()).start(Pod::run("metrics"));
    assert_eq!(c.inc(), 1);
    let name = c.suspend();
    let _snapshots = Cleanup::snapshots(&c.actor);

    // The shim's reports arrive on their own (fire-and-forget): waited for.
    let after_suspend = wait_for("the suspend to show in the metrics", LIVENESS, || {
        let m = scrape(&addr);
        let moved = value(&m, &total("suspend", "api")) > value(&before, &total("suspend", "api"))
            && value(&m, &count("dump", "suspend")) > value(&before, &count("dump", "suspend"))
            && value(&m, &count("commit", "suspend")) > value(&before, &count("commit", "suspend"))
            && value(&m, r#"torpor_actors{state="suspended"}"#) >= 1.0;
        moved.then_some(m)
    });
    for phase in ["prepare", "freeze", "fsync"] {
        assert!(
            value(&after_suspend, &count(phase, "suspend")) > value(&before, &count(phase, "suspend")),
            "phase {phase}: {after_suspend:?}"
        );
    }
    assert!(
        value(&after_suspend, r#"torpor_lifecycle_operations_total{op="suspend",outcome="ok"}"#)
            > value(&before, r#"torpor_lifecycle_operations_total{op="suspend",outcome="ok"}"#)
    );

    // Up to the object tier and out of the local one: the resume fetches it.
    let out = torporctl(&["snapshots", "upload", &name]);
    assert!(out.success(), "upload {name}: {out}");
    let out = torporctl(&["snapshots", "evict", &name]);
    assert!(out.success(), "evict {name}: {out}");
    c.op("resume");
    assert_eq!(c.status()["state"], "RUNNING");
    assert_eq!(c.inc(), 2, "the counter went on from where it was");

    // The resume streamed the snapshot back: its fetch is observed when
    // the stream has brought the last chunk, which may come after the
    // resume's answer.
    let after = wait_for("the resume and its fetch to show in the metrics", LIVENESS, || {
        let m = scrape(&addr);
        let moved = value(&m, &total("resume", "api")) > value(&before, &total("resume", "api"))
            && value(&m, "torpor_fetch_duration_seconds_count") > value(&before, "torpor_fetch_duration_seconds_count")
            && value(&m, r#"torpor_actors{state="running"}"#) >= 1.0;
        moved.then_some(m)
    });
    for (key, what) in [
        (count("fetch", "resume"), "the resume's checkout"),
        (count("criu_restore", "resume"), "the resume's restore"),
        (count("upload", "suspend"), "the store's upload"),
        ("torpor_fetch_duration_seconds_count".into(), "the store's fetch"),
        ("torpor_store_uploaded_bytes_total".into(), "bytes uploaded"),
        ("torpor_store_uploaded_chunks_total".into(), "chunks uploaded"),
        ("torpor_store_fetched_bytes_total".into(), "bytes fetched"),
        (r#"torpor_lifecycle_operations_total{op="resume",outcome="ok"}"#.into(), "resumes"),
    ] {
        assert!(
            value(&after, &key) > value(&before, &key),
            "{what} ({key}) did not go up: before {} after {}",
            value(&before, &key),
            value(&after, &key)
        );
    }
    assert!(value(&after, "torpor_store_local_budget_bytes") > 0.0, "{after:?}");
    assert!(value(&after, "torpor_store_actor_leases") >= 1.0, "this actor's lease at least: {after:?}");
    for key in
        ["torpor_store_deduplicated_bytes_total", "torpor_store_lease_renew_failures_total", "torpor_lifecycle_reports_dropped_total"]
    {
        assert!(after.contains_key(key), "{key} is exposed: {after:?}");
    }

    // Asleep again, woken by a connection: the trigger says so.
    c.suspend();
    assert_eq!(c.inc(), 3, "a connection woke it");
    wait_for("the resume by a connection to show in the metrics", LIVENESS, || {
        (value(&scrape(&addr), &total("resume", "connection")) > value(&after, &total("resume", "connection"))).then_some(())
    });

    // Never an actor id (or a pod, a snapshot) in a label.
    let (_, text) = get(&addr, "/metrics", None);
    assert!(!text.contains("phase=\"total\""), "a total is never a phase:\n{text}");
    for id in [c.actor.as_str(), c.shim(), name.as_str()] {
        assert!(!text.contains(id), "{id} appears in the exposition:\n{text}");
    }
    // promtool reads the exposition and lints it (names, types, units).
    let out = run_with(promtool, ["check", "metrics"], Some(text.as_bytes()), COMMAND_LIMIT);
    assert!(out.success(), "promtool check metrics: {out}\n{text}");
    eprintln!("promtool check metrics: ok ({} samples)", samples(&text).len());

    // OpenMetrics when asked for (what Prometheus asks for), ending in EOF.
    let (code, om) = get(&addr, "/metrics", Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"));
    assert_eq!(code, 200);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# UNIT torpor_suspend_duration_seconds seconds"), "{om}");
    // Nothing else is served.
    assert_eq!(get(&addr, "/", None).0, 404);
    assert_eq!(get(&addr, "/metrics/x", None).0, 404);
}
