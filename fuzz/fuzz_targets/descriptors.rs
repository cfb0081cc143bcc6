//! Fuzz target: arbitrary descriptors posted on a connected VI's queues;
//! see `via_tests::rig::scenarios::post_descriptors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_tests::rig::scenarios::post_descriptors(data));
