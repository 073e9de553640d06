//! `crictl` against the rig of the single-node tests (node A); other nodes
//! through [`Node::crictl`].

use serde_json::Value;

use crate::command::Output;
use crate::node::Node;

/// `crictl <args>` against the rig (node A).
#[track_caller]
pub fn crictl(args: &[&str]) -> Output {
    Node::a().crictl(args)
}

/// `crictl <args>` with `input` on stdin.
#[track_caller]
pub fn crictl_stdin(args: &[&str], input: &[u8]) -> Output {
    Node::a().crictl_stdin(args, input)
}

/// `crictl <args>`, panicking on failure; returns trimmed stdout.
#[track_caller]
pub fn crictl_ok(args: &[&str]) -> String {
    Node::a().crictl_ok(args)
}

/// `crictl <args>` whose stdout is JSON.
#[track_caller]
pub fn crictl_json(args: &[&str]) -> Value {
    Node::a().crictl_json(args)
}
