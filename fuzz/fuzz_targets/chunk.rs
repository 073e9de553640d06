#![no_main]
//! Fuzz target `chunk`: [`torpor_snapshotter::fuzzing::chunk`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::chunk(data) {
        panic!("chunk: {e}");
    }
});
