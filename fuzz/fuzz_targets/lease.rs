#![no_main]
//! Fuzz target `lease`: [`torpor_snapshotter::fuzzing::lease`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::lease(data) {
        panic!("lease: {e}");
    }
});
