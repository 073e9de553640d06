//! Tenants stay apart (issue 38, row 1; docs/SECURITY.md, "Pod authors"):
//! an actor belongs to its pod's Kubernetes namespace (CRI's sandbox
//! metadata, which no pod author sets). A pod of another namespace can
//! neither take an actor over (`torpor.dev/actor: <their ns>/<name>`), nor
//! restore or clone another namespace's snapshot (`torpor.dev/restore-from`)
//! unless the node allows that namespace as a clone source (the rig's
//! torpor-snapshotter: `[tenancy] clone_source_namespaces = ['torpor-golden']`),
//! and what it is told names nothing of the other tenant. A bare
//! `torpor.dev/actor` name is an actor of the pod's own namespace.
//!
//! torpor-only: under TORPOR_TEST_RUNTIME=runc each test is reported ignored.

use torpor_tests::*;

/// The namespace of the other tenant's pods.
const OTHER: &str = "torpor-other";
/// The namespace the rig's nodes allow clones from.
const GOLDEN: &str = "torpor-golden";

/// A counter of actor `actor` in namespace `ns`, counted to `n` and
/// suspended: its snapshot's name.
fn suspended_counter(ns: &str, prefix: &str, actor: &str, n: u64) -> (Counter, String) {
    let opts = PodOptions::actor(actor).in_namespace(ns);
    let c = CounterSpec::new().alloc_mib(8).seed("4242").start(Pod::run_with(prefix, opts));
    c.count_to(n);
    let snap = c.suspend();
    (c, snap)
}

/// `crictl runp` of a pod of namespace `ns` with `annotations`, then
/// `crictl create` and `start` of a counter in it: the refusal's output
/// (one of them must fail).
#[track_caller]
fn refused(ns: &str, prefix: &str, annotations: &[(&str, &str)]) -> String {
    // The pod's sandbox gets its annotations too: refused at runp is fine.
    let pod = match Pod::try_run(prefix, PodOptions::annotated(annotations).in_namespace(ns)) {
        Ok(p) => p,
        Err(out) => return out.all_output(),
    };
    let out = match pod.try_create(&CounterSpec::new().alloc_mib(8).config()) {
        Ok(id) => {
            let out = pod.node.crictl(&["start", &id]);
            assert!(!out.success(), "a pod of {ns} with {annotations:?} started: {out}");
            out
        }
        Err(out) => out,
    };
    out.all_output()
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn another_namespaces_actor_is_neither_taken_over_nor_cloned() {
    torpor_only();
    let name = unique_name("tn-victim");
    let victim_actor = format!("{POD_NAMESPACE}/{name}");
    let _snaps = Cleanup::snapshots(&victim_actor);
    let (victim, snap) = suspended_counter(POD_NAMESPACE, "tn-victim", &victim_actor, 7);

    // Taking it over by its id: refused at create, naming only the pod's own namespace.
    let text = refused(OTHER, "tn-thief", &[("torpor.dev/actor", &victim_actor)]);
    eprintln!("take-over refused: {text}");
    assert!(text.contains("torpor.dev/actor"), "names the annotation: {text}");
    assert!(text.contains(&format!("belongs to the pod's namespace {OTHER}")), "says why: {text}");
    assert!(!text.contains(&victim.pod.name) && !text.contains("SUSPENDED"), "nothing of the victim: {text}");

    // Restoring or cloning its snapshot: refused before any lookup, the
    // same answer for a snapshot that exists and one that does not.
    let missing = format!("{POD_NAMESPACE}/{}", unique_name("tn-none"));
    let mut answers = Vec::new();
    for source in [snap.clone(), victim_actor.clone(), missing.clone()] {
        let text = refused(OTHER, "tn-cloner", &[("torpor.dev/restore-from", &source)]);
        eprintln!("clone of {source} refused: {text}");
        assert!(text.contains("torpor.dev/restore-from") && text.contains(&source), "names the annotation and value: {text}");
        assert!(text.contains("clone_source_namespaces"), "says which namespaces the node allows: {text}");
        assert!(!text.contains("no snapshot"), "says nothing of what the other namespace holds: {text}");
        // The refusal itself (crictl's lines carry a time and a pid).
        let text = text.replace(&source, "<source>");
        let refusal = text.find("invalid annotation").map(|i| {
            let line = text[i..].lines().next().unwrap_or_default();
            line.split("containerID").next().unwrap_or_default().to_string()
        });
        answers.push(refusal.unwrap_or_else(|| panic!("no refusal in: {text}")));
    }
    assert_eq!(answers[1], answers[2], "an existing actor and a missing one get the same answer");

    // A bare name is an actor of the pod's own namespace: a new actor,
    // started cold, not the victim's state.
    let own = format!("{OTHER}/{name}");
    let _own_snaps = Cleanup::snapshots(&own);
    let c = CounterSpec::new().alloc_mib(8).start(Pod::run_with("tn-same-name", PodOptions::actor(&name).in_namespace(OTHER)));
    assert_eq!(c.actor, own);
    assert_eq!(c.status()["actor"], own.as_str(), "{}", c.status());
    assert_eq!(c.cmd("get"), "0", "a cold start, not the other namespace's counter");
    assert!(c.status()["recovered_from"].is_null() && c.status()["cloned_from"].is_null(), "{}", c.status());

    // The victim is untouched.
    let out = torporctl(&["resume", victim.shim()]);
    assert!(out.success(), "{out}");
    assert_eq!(victim.cmd("get"), "7");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn a_namespace_the_node_allows_is_cloned_from() {
    torpor_only();
    let golden_actor = format!("{GOLDEN}/{}", unique_name("tn-golden"));
    let _g = Cleanup::snapshots(&golden_actor);
    let (_golden, snap) = suspended_counter(GOLDEN, "tn-golden", &golden_actor, 5);
    let clone = actor_name("tn-clone");
    let _c = Cleanup::snapshots(&clone);
    let opts = PodOptions::annotated(&[("torpor.dev/actor", &clone), ("torpor.dev/restore-from", &golden_actor)]);
    let c = CounterSpec::new().alloc_mib(8).seed("4242").start(Pod::run_with("tn-clone", opts));
    assert_eq!(c.cmd("get"), "5", "restored from the golden snapshot");
    assert_eq!(c.status()["cloned_from"], snap.as_str(), "{}", c.status());
    assert_eq!(c.cmd("inc"), "6");
}
