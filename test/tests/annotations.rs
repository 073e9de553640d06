//! Bad torpor annotations are refused with a clear error, never silently
//! defaulted. torpor-only: under TORPOR_TEST_RUNTIME=runc there is nothing to
//! test (runc ignores torpor.dev/*: the tests are reported ignored), under
//! the default `torpor` they must run.

use torpor_tests::*;

/// Runs pod + container with `annotations` on the pod; returns the error
/// output of the first step that failed, or None if everything succeeded.
fn first_failure(prefix: &str, annotations: &[(&str, &str)]) -> (Option<Pod>, Option<(String, Output)>) {
    let pod = match Pod::try_run(prefix, PodOptions::annotated(annotations)) {
        Ok(p) => p,
        // The sandbox is created by the same runtime: refusing the bad pod
        // already at RunPodSandbox is acceptable too.
        Err(o) => return (None, Some(("runp".into(), o))),
    };
    let id = match pod.try_create(&container_config("main", &["sleep"])) {
        Ok(id) => id,
        Err(o) => return (Some(pod), Some(("create".into(), o))),
    };
    let out = crictl(&["start", &id]);
    if !out.success() {
        return (Some(pod), Some(("start".into(), out)));
    }
    (Some(pod), None)
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn invalid_idle_after_fails_container_creation_naming_the_annotation() {
    torpor_only();
    let (_pod, failure) = first_failure("badidle", &[("torpor.dev/idle-after", "banana")]);
    let (step, out) = failure.expect("a pod with torpor.dev/idle-after=banana must not start");
    let text = out.all_output();
    eprintln!("refused at `crictl {step}`: {}", out.stderr.trim());
    assert!(text.contains("torpor.dev/idle-after"), "the error of `crictl {step}` names the annotation:\n{out}");
}

#[test]
#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the torpor runtime")]
fn valid_idle_after_is_accepted() {
    torpor_only();
    let (pod, failure) = first_failure("goodidle", &[("torpor.dev/idle-after", "5m")]);
    if let Some((step, out)) = failure {
        panic!("a valid torpor.dev/idle-after was refused at {step}: {out}");
    }
    drop(pod);
}
