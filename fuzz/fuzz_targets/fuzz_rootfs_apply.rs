//! A rootfs changeset (tar entries) applied to a scratch rootfs: nothing
//! outside it may change, nothing may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torpor_runtime::system::rootfs::fuzz_apply(data);
});
