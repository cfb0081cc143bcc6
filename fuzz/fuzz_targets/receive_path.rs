//! Fuzz target: arbitrary frames through the loopback wire at a live,
//! connected VI amid genuine traffic both ways; the oracle checks that
//! every genuine message arrives once, in order, intact, that no hostile
//! byte lands in any receive or anywhere else, and that the connection
//! stays up unless the peer's own violation broke it (reported as such).
//! See `via_tests::rig::receive_path`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_tests::rig::scenarios::receive_path(data));
