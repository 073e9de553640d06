//! Many cycles of one actor, and many actors at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::thread;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::{actor, panic_text};

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn soak_200_cycles() {
    torpor_only();
    const CYCLES: u64 = 200;
    let a = actor("susp-soak", &[]);
    let mut value = a.inc();
    assert_eq!(value, 1);
    for cycle in 1..=CYCLES {
        let st = a.op("suspend");
        assert_eq!(st["state"], "SUSPENDED", "cycle {cycle}: {st}");
        let st = a.op("resume");
        assert_eq!(st["state"], "RUNNING", "cycle {cycle}: {st}");
        let got = a.inc();
        assert_eq!(got, value + 1, "cycle {cycle}: counter after the resume");
        value = got;
        if cycle % 50 == 0 {
            eprintln!("soak: {cycle} cycles, last suspend {} ms, resume {} ms", st["last_suspend_ms"], st["last_resume_ms"]);
        }
    }
    assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    let Counter { pod, .. } = a;
    pod.remove();
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn twenty_actors_concurrently() {
    torpor_only();
    const N: usize = 20;
    require_rig();

    // Run them all at once; failures are collected so every guard cleans up.
    let started: Arc<Mutex<Vec<Result<Counter, String>>>> = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let started = Arc::clone(&started);
            thread::spawn(move || {
                let r = std::panic::catch_unwind(|| {
                    let a = actor(&format!("susp-many{i}"), &[]);
                    assert_eq!(a.inc(), 1);
                    a
                });
                started.lock().unwrap().push(r.map_err(panic_text));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let mut actors = Vec::new();
    let mut errors = Vec::new();
    for r in std::mem::take(&mut *started.lock().unwrap()) {
        match r {
            Ok(a) => actors.push(Arc::new(a)),
            Err(e) => errors.push(e),
        }
    }
    assert!(errors.is_empty(), "{} of {N} actors did not start:\n{}", errors.len(), errors.join("\n---\n"));

    // Apply `op` to all at once; returns the failures.
    let all = |op: &'static str, want: &'static str| -> Vec<String> {
        let handles: Vec<_> = actors
            .iter()
            .map(|a| {
                let a = Arc::clone(a);
                thread::spawn(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let st = a.op(op);
                        assert_eq!(st["state"], want, "{op} {}: {st}", a.shim());
                    }))
                    .map_err(|e| format!("{}: {}", a.pod.name, panic_text(e)))
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().expect("thread").err()).collect()
    };

    let failed = all("suspend", "SUSPENDED");
    assert!(failed.is_empty(), "concurrent suspends failed:\n{}", failed.join("\n---\n"));

    // all SUSPENDED at the same time (one status of every actor on the node)
    let out = torporctl(&["--json", "status"]);
    let v: Value = serde_json::from_str(&out.clone().ok()).expect("status JSON");
    let ours: BTreeSet<&str> = actors.iter().map(|a| a.shim()).collect();
    let mut seen = BTreeSet::new();
    for r in v.as_array().expect("array") {
        let shim = r["shim"].as_str().unwrap_or_default();
        if ours.contains(shim) {
            assert_eq!(r["actor"]["state"], "SUSPENDED", "{r}");
            seen.insert(shim);
        }
    }
    assert_eq!(seen, ours, "every actor is listed by `torporctl status`");
    for a in &actors {
        assert_eq!(container_state(&a.container), "CONTAINER_RUNNING");
    }

    let failed = all("resume", "RUNNING");
    assert!(failed.is_empty(), "concurrent resumes failed:\n{}", failed.join("\n---\n"));
    for a in &actors {
        assert_eq!(a.inc(), 2, "counter of {} after the resume", a.pod.name);
    }

    // remove all, concurrently
    let handles: Vec<_> = actors
        .into_iter()
        .map(|a| {
            thread::spawn(move || {
                let a = Arc::try_unwrap(a).unwrap_or_else(|_| panic!("actor still shared"));
                let name = a.pod.name.clone();
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || a.pod.remove()))
                    .map_err(|e| format!("{name}: {}", panic_text(e)))
            })
        })
        .collect();
    let failed: Vec<String> = handles.into_iter().filter_map(|h| h.join().expect("thread").err()).collect();
    assert!(failed.is_empty(), "removal failed:\n{}", failed.join("\n---\n"));
}
