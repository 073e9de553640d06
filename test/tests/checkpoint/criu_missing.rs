//! CRIU missing or too old: a second, private containerd whose shims find
//! no usable `criu`.

use std::path::{Path, PathBuf};

use torpor_tests::*;

use crate::NS;

/// A second, private containerd (test/rig/up.sh with its own names) whose
/// PATH, and so its shims' PATH, has no `criu`. Torn down (down.sh --purge)
/// on drop.
struct CriulessRig {
    env: Vec<(String, String)>,
    address: String,
    bin: PathBuf,
    /// Its cgroup parent (`TORPOR_RIG_CGROUP`): its down.sh removes it.
    cgroup: String,
}

impl CriulessRig {
    #[track_caller]
    fn up() -> CriulessRig {
        require_rig();
        let rig_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rig");
        let state = format!("{}-nocriu", rig().state_dir);
        let root = format!("{}-nocriu", std::env::var("TORPOR_RIG_ROOT").unwrap_or_else(|_| "/var/lib/torpor-test".into()));
        let tag = state.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        // PATH without any directory holding criu (runc must stay reachable)
        let path = std::env::var("PATH").unwrap_or_default();
        let kept: Vec<&str> = path
            .split(':')
            .chain(["/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
            .filter(|d| !d.is_empty() && !Path::new(d).join("criu").exists())
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        let kept: Vec<&str> = kept.into_iter().filter(|d| seen.insert(*d)).collect();
        assert!(
            kept.iter().any(|d| Path::new(d).join("runc").is_file()),
            "cannot hide criu from a containerd: runc is only in a directory that also holds criu (PATH {path})"
        );
        let bin = PathBuf::from(&state).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let shim_dir = std::env::var("TORPOR_SHIM_DIR")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release").to_string());
        let shim = Path::new(&shim_dir).join("containerd-shim-torpor-v1");
        if shim.is_file() {
            std::fs::copy(&shim, bin.join("containerd-shim-torpor-v1")).unwrap();
        } else if is_torpor() {
            panic!("{} not built (cargo build --release -p torpor-shim)", shim.display());
        }
        let cni_net = format!("{}-nocriu", std::env::var("TORPOR_RIG_CNI_NETWORK").unwrap_or_else(|_| "torpor-test".into()));
        let cgroup = format!("{}-nocriu", rig().cgroup);
        let env = vec![
            ("PATH".to_string(), kept.join(":")),
            ("TORPOR_RIG_STATE".into(), state.clone()),
            ("TORPOR_RIG_ROOT".into(), root),
            ("TORPOR_RIG_CNI_NETWORK".into(), cni_net),
            ("TORPOR_RIG_BRIDGE".into(), format!("tpc{:08x}", tag)),
            ("TORPOR_RIG_SUBNET".into(), format!("10.{}.0.0/16", 250 + tag % 5)),
            ("TORPOR_RIG_CGROUP".into(), cgroup.clone()),
            ("TORPOR_SHIM_DIR".into(), bin.to_string_lossy().into_owned()),
            // one node is enough here
            ("TORPOR_RIG_NODE_B".into(), "0".into()),
        ];
        let me = CriulessRig { env, address: format!("{state}/containerd.sock"), bin, cgroup };
        let out = me.script(&format!("{rig_dir}/up.sh"), &[]);
        if !out.success() {
            // up.sh may trip over its own image check on a loaded machine; it is idempotent
            let again = me.script(&format!("{rig_dir}/up.sh"), &[]);
            assert!(again.success(), "second containerd did not come up:\n{out}\n{again}");
        }
        me
    }

    fn script(&self, script: &str, args: &[&str]) -> Output {
        let mut a: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        a.push("bash".into());
        a.push(script.into());
        a.extend(args.iter().map(|s| s.to_string()));
        run_with("env", a, None, COMMAND_LIMIT)
    }

    #[track_caller]
    fn ctr(&self, args: &[&str]) -> Output {
        let mut a = vec!["--address", self.address.as_str(), "-n", NS];
        a.extend_from_slice(args);
        run(&rig().ctr, a)
    }

    #[track_caller]
    fn task_status(&self, id: &str) -> Option<String> {
        task_status_in(&self.ctr(&["task", "ls"]).ok(), id)
    }
}

impl Drop for CriulessRig {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let out = self.script(concat!(env!("CARGO_MANIFEST_DIR"), "/rig/down.sh"), &["--purge"]);
            if !out.success() {
                eprintln!("tearing down the CRIU-less containerd: {out}");
            }
        }));
    }
}

/// With no `criu` in the shim's PATH, and with a `criu` too old to speak
/// runc's protocol, a checkpoint fails with an error that names CRIU, the
/// container keeps running, no checkpoint is left.
#[test]
fn checkpoint_without_usable_criu_fails_clearly() {
    let side = CriulessRig::up();
    let id = unique_name("ckpt-nocriu");
    let run = ctr_run_args(&side.cgroup, NS, &["-d"], &id, &["/actor", "counter"]);
    let out = side.ctr(&run.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.success(), "{out}");
    wait_for("the task to run", LIVENESS, || (side.task_status(&id).as_deref() == Some("RUNNING")).then_some(()));

    let checkpoints = || -> Vec<String> {
        let prefix = format!("containerd.io/checkpoint/{id}:");
        side.ctr(&["images", "ls", "-q"]).ok().lines().filter(|l| l.starts_with(&prefix)).map(str::to_string).collect()
    };

    // no criu at all
    let out = side.ctr(&["task", "checkpoint", &id]);
    assert!(!out.success(), "checkpoint without criu succeeded: {out}");
    let err = out.stderr.to_lowercase();
    assert!(err.contains("criu") && err.contains("not found"), "error does not say criu is missing: {out}");
    assert_eq!(side.task_status(&id).as_deref(), Some("RUNNING"), "the container keeps running");
    assert!(checkpoints().is_empty(), "{:?}", checkpoints());

    // a criu that is too old: reports its version, speaks no RPC
    let stub = side.bin.join("criu");
    std::fs::write(&stub, "#!/bin/sh\ncase \"$1\" in --version|-V) echo 'Version: 3.17.1'; exit 0;; esac\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = side.ctr(&["task", "checkpoint", &id]);
    assert!(!out.success(), "checkpoint with an old criu succeeded: {out}");
    assert!(out.stderr.to_lowercase().contains("criu"), "error does not name CRIU: {out}");
    if is_torpor() {
        assert!(out.stderr.contains("3.17.1"), "error does not say which CRIU version was found (too old): {out}");
    }
    assert_eq!(side.task_status(&id).as_deref(), Some("RUNNING"), "the container keeps running");
    assert!(checkpoints().is_empty(), "{:?}", checkpoints());

    let _ = side.ctr(&["task", "kill", "-s", "SIGKILL", &id]);
    wait_for("the task to stop", LIVENESS, || matches!(side.task_status(&id).as_deref(), None | Some("STOPPED")).then_some(()));
    let out = side.ctr(&["task", "delete", &id]);
    assert!(out.success(), "{out}");
    let out = side.ctr(&["containers", "rm", &id]);
    assert!(out.success(), "{out}");
}
