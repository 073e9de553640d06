#![no_main]
//! Fuzz target `config`: [`torpor_snapshotter::fuzzing::config`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = torpor_snapshotter::fuzzing::config(data) {
        panic!("config: {e}");
    }
});
