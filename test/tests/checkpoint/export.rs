//! `crictl checkpoint --export`, read back by checkpointctl.

use std::path::Path;

use torpor_tests::serde_json::{self, Value};
use torpor_tests::*;

use crate::counter;

fn find_tool(env_key: &str, name: &str) -> String {
    if let Ok(v) = std::env::var(env_key) {
        if !v.is_empty() {
            return v;
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/local/bin", "/usr/bin", "/usr/local/sbin", "/usr/sbin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p.to_string_lossy().into_owned();
        }
    }
    panic!("{name} not found in PATH or /usr/local/bin (set {env_key}); it is a dependency of these tests");
}

/// `crictl checkpoint --export` writes an archive that checkpointctl reads;
/// the container keeps running.
#[test]
fn crictl_checkpoint_export_is_readable_by_checkpointctl() {
    let checkpointctl = find_tool("TORPOR_CHECKPOINTCTL", "checkpointctl");
    let pod = Pod::run("ckpt-export");
    let cid = pod.start_actor("counter", &["counter", "--port", "8080"]);
    wait_container_state(&cid, "CONTAINER_RUNNING");
    let addr = format!("{}:8080", pod.ip());
    assert_eq!(counter(&addr, &["inc", "inc"]), ["1", "2"]);

    let archive = pod.dir().join("checkpoint.tar");
    let archive_s = archive.to_string_lossy().into_owned();
    let out = crictl(&["checkpoint", &format!("--export={archive_s}"), &cid]);
    assert!(out.success(), "{out}");
    assert_eq!(container_state(&cid), "CONTAINER_RUNNING", "crictl checkpoint leaves the container running");
    assert_eq!(counter(&addr, &["get", "inc"]), ["2", "3"]);

    let listing = run("tar", ["-tf", archive_s.as_str()]).ok();
    for want in ["checkpoint/inventory.img", "config.dump", "spec.dump"] {
        assert!(listing.lines().any(|l| l.trim_start_matches("./") == want), "{want} not in the archive:\n{listing}");
    }

    let show = run(&checkpointctl, ["show", archive_s.as_str()]);
    assert!(show.success(), "{show}");
    assert!(show.stdout.contains("counter"), "{show}");
    assert!(show.stdout.contains(&runtime_type()), "{show}");

    let plain = run(&checkpointctl, ["inspect", archive_s.as_str()]);
    assert!(plain.success(), "{plain}");

    let out = run(&checkpointctl, ["inspect", "--format", "json", "--ps-tree", "--files", "--sockets", "--mounts", archive_s.as_str()]);
    assert!(out.success(), "{out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("checkpointctl inspect JSON: {e}\n{out}"));
    let c = &v[0];
    assert_eq!(c["container_name"], "counter", "{c}");
    assert_eq!(c["runtime"], runtime_type().as_str(), "{c}");
    assert_eq!(c["engine"], "containerd", "{c}");
    assert_eq!(c["process_tree"]["command"], "actor", "{c}");
    assert!(c["checkpoint_size"]["memory_pages_size"].as_u64().unwrap_or(0) > 0, "{c}");
    let listening = c["sockets"].as_array().into_iter().flatten().any(|p| {
        p["open_sockets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["protocol"] == "TCP" && s["data"]["state"] == "LISTEN" && s["data"]["src_port"] == 8080)
    });
    assert!(listening, "the counter's listening socket is in the checkpoint: {c}");
}
