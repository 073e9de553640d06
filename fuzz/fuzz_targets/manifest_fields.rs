#![no_main]
//! Fuzz target `manifest_fields`: [`torpor_snapshotter::fuzzing::manifest_fields`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::manifest_fields(data) {
        panic!("manifest_fields: {e}");
    }
});
