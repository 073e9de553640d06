//! What is under test: the rig of the single-node tests (node A) and the
//! CRI runtime handler, with the guard of the torpor-only tests.

use crate::node::Node;
use crate::rig::Rig;
use crate::BUILT_FOR;

/// The rig settings of node A, the node every single-node test uses (read
/// once from the environment). [`Node::b`] is the second node.
pub fn rig() -> &'static Rig {
    &Node::a().rig
}

/// Fails the test unless the rig (node A) answers and has the test images.
/// Call at the start of each test: a clear message beats a cascade of crictl
/// errors.
#[track_caller]
pub fn require_rig() {
    Node::a().require()
}

/// CRI runtime handler under test (`TORPOR_TEST_RUNTIME`, default `torpor`).
pub fn runtime_handler() -> &'static str {
    &rig().runtime
}

/// Whether the runtime under test is torpor (torpor-only tests run then).
pub fn is_torpor() -> bool {
    runtime_handler() == "torpor"
}

/// The guard of a torpor-only test: its first line. Such a test is also
/// marked `#[cfg_attr(not_torpor_runtime, ignore = "torpor-only: needs the
/// torpor runtime")]`, so that under another runtime the run reports it
/// ignored (test/build.rs). If it runs anyway (`--ignored`, or a binary
/// built for torpor run under another `TORPOR_TEST_RUNTIME`) it fails here:
/// a torpor-only test never passes without having run.
#[track_caller]
pub fn torpor_only() {
    let handler = runtime_handler();
    assert!(
        handler == "torpor",
        "a torpor-only test cannot run under runtime {handler} (the binary was built for {BUILT_FOR}); \
         build the tests with TORPOR_TEST_RUNTIME={handler} so that it is reported ignored"
    );
}

/// containerd runtime_type (`ctr run --runtime`) of the handler under test.
pub fn runtime_type() -> String {
    if let Ok(v) = std::env::var("TORPOR_TEST_RUNTIME_TYPE") {
        if !v.is_empty() {
            return v;
        }
    }
    match runtime_handler() {
        "torpor" => "io.containerd.torpor.v1".into(),
        "runc" => "io.containerd.runc.v2".into(),
        other => panic!("don't know the runtime_type of TORPOR_TEST_RUNTIME={other}; set TORPOR_TEST_RUNTIME_TYPE"),
    }
}
