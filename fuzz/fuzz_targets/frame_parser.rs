//! Fuzz target: the wire parsers (`Frame::new_checked`, `HeaderRepr`,
//! `ConnRepr`, the checksum) on arbitrary bytes; see
//! `via_tests::rig::scenarios::parse_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_tests::rig::scenarios::parse_frame(data));
