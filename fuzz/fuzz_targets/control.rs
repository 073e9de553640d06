#![no_main]
//! Fuzz target `control`: the control API's decoding
//! ([`torpor_api::control::fuzz_decode`]): ttrpc request and response
//! bodies, their statuses and error details, and every message.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torpor_api::control::fuzz_decode(data);
});
