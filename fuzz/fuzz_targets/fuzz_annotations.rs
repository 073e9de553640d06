//! `torpor.dev/*` annotations (`key=value` lines): parsing never panics,
//! and what it accepts keeps the bounds.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torpor_runtime::oci::annotations::fuzz_parse(data);
});
