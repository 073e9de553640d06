#![no_main]
//! Fuzz target `manifest`: [`torpor_snapshotter::fuzzing::manifest`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::manifest(data) {
        panic!("manifest: {e}");
    }
});
