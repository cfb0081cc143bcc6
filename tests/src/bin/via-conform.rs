//! One half of a VIA conformance rule, run as a real process in a test
//! namespace: `via-conform target|initiator RULE --dev DEVICE [--peer MAC]`.
//! The rules live in `via_tests::conform`.

fn main() {
    via_tests::conform::main();
}
