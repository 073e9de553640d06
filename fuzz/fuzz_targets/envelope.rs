#![no_main]
//! Fuzz target `envelope`: [`torpor_snapshotter::fuzzing::envelope`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::envelope(data) {
        panic!("envelope: {e}");
    }
});
