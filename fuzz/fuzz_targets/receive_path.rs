//! Fuzz target: arbitrary frames through the loopback wire at a live,
//! connected VI amid genuine traffic; see
//! `via_tests::rig::scenarios::receive_path`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_tests::rig::scenarios::receive_path(data));
