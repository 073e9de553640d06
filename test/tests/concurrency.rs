//! Many pods at once: all come up, all go away, nothing is left behind.

use std::sync::{Arc, Mutex};
use std::thread;
use torpor_tests::*;

const PODS: usize = 20;

struct Started {
    pod: Pod,
    container: String,
    netns: Option<String>,
}

#[test]
fn twenty_pods_concurrently_then_clean_removal() {
    require_rig();
    let results: Arc<Mutex<Vec<Result<Started, String>>>> = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..PODS)
        .map(|i| {
            let results = Arc::clone(&results);
            thread::spawn(move || {
                // Each thread owns its pod guard; a failure is recorded, not
                // panicked, so every pod is still cleaned up by its guard.
                let r = std::panic::catch_unwind(|| {
                    let pod = Pod::run(&format!("conc{i}"));
                    let id = pod.start_actor("main", &["sleep"]);
                    wait_container_state(&id, "CONTAINER_RUNNING");
                    let netns = pod.netns_path();
                    Started { pod, container: id, netns }
                });
                let r = r.map_err(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into())
                });
                results.lock().unwrap().push(r);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let results = std::mem::take(&mut *results.lock().unwrap());
    let mut started = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(s) => started.push(s),
            Err(e) => errors.push(e),
        }
    }
    assert!(errors.is_empty(), "{} of {PODS} pods failed:\n{}", errors.len(), errors.join("\n---\n"));
    assert_eq!(started.len(), PODS);

    // all of them are listed as ready / running at the same time
    let pods = crictl_json(&["pods", "-o", "json", "--state", "ready", "--label", "torpor-test=true"]);
    let ready: Vec<String> = pods["items"].as_array().unwrap().iter().filter_map(|p| p["id"].as_str().map(String::from)).collect();
    for s in &started {
        assert!(ready.contains(&s.pod.id), "pod {} ({}) is ready", s.pod.id, s.pod.name);
        assert_eq!(container_state(&s.container), "CONTAINER_RUNNING");
    }
    let mut ips: Vec<String> = started.iter().map(|s| s.pod.ip()).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), PODS, "every pod has its own IP");

    // what to look for afterwards
    let ids: Vec<(String, String, Option<String>)> =
        started.iter().map(|s| (s.pod.id.clone(), s.container.clone(), s.netns.clone())).collect();
    for (_, _, netns) in &ids {
        let ns = netns.as_deref().expect("every pod has a network namespace path");
        assert!(std::path::Path::new(ns).exists(), "netns {ns} exists while the pod runs");
    }

    // remove them all, concurrently as well
    let handles: Vec<_> =
        started.into_iter().map(|s| thread::spawn(move || std::panic::catch_unwind(move || s.pod.remove()).is_ok())).collect();
    let failed = handles.into_iter().map(|h| h.join().unwrap()).filter(|ok| !ok).count();
    assert_eq!(failed, 0, "{failed} pods failed to stop/remove cleanly");

    // nothing left: no pod, no shim, no mount, no netns
    let mut leftovers = Vec::new();
    for (pod_id, ctr_id, netns) in &ids {
        if crictl(&["inspectp", pod_id]).success() {
            leftovers.push(format!("pod {pod_id} still known to CRI"));
        }
        for id in [pod_id, ctr_id] {
            for p in processes_mentioning(id) {
                leftovers.push(format!("process for {id}: {p}"));
            }
            for m in mounts_mentioning(id) {
                leftovers.push(format!("mount for {id}: {m}"));
            }
        }
        if let Some(ns) = netns {
            if std::path::Path::new(ns).exists() {
                leftovers.push(format!("netns file {ns} still exists"));
            }
            for m in mounts_mentioning(ns) {
                leftovers.push(format!("netns mount {ns}: {m}"));
            }
        }
    }
    assert!(leftovers.is_empty(), "left behind after removal:\n{}", leftovers.join("\n"));
}
