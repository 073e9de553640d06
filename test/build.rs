//! Which runtime handler the integration tests are built for
//! (`TORPOR_TEST_RUNTIME`, default `torpor`; test/rig/run-tests.sh sets it
//! before it builds them).
//!
//! Under another handler (`runc`, the baseline) the torpor-only tests are
//! compiled with `#[ignore]` (cfg `not_torpor_runtime`, set here), so the
//! test run reports them as ignored instead of passing them.
//! `torpor_tests::torpor_only()` fails such a test if it runs anyway
//! (`--ignored`, or a binary built for one runtime run under another).

fn main() {
    println!("cargo::rerun-if-env-changed=TORPOR_TEST_RUNTIME");
    println!("cargo::rustc-check-cfg=cfg(not_torpor_runtime)");
    let runtime = match std::env::var("TORPOR_TEST_RUNTIME") {
        Ok(v) if !v.is_empty() => v,
        _ => "torpor".to_string(),
    };
    if runtime != "torpor" {
        println!("cargo::rustc-cfg=not_torpor_runtime");
    }
    // what the binaries were built for, checked against the runtime they run under
    println!("cargo::rustc-env=TORPOR_TESTS_BUILT_FOR={runtime}");
}
