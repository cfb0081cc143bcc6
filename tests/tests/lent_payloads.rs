//! Registered memory copied once between processes of one host: two
//! `via-testpeer`s on one test host, each on a composite device whose
//! shared-memory wire lends payloads (`<nic>+shm:<wire>,lend=<bytes>`),
//! move every size from 0 B to 1 MiB both ways, contents checked, and the
//! payloads from the lending threshold up arrive lent (read from the
//! sender's memory with `process_vm_readv`), none below it or with lending
//! off. Frames that cross the wire carry no CRC (memory cannot corrupt
//! them; the device vouches for each), and arrive intact all the same.
//! Needs root.

use via_tests::{testpeer_pair, PeerSide, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");

/// Runs the `sizes` scenario between two processes of host a on `wire`
/// (its options included); returns how many payloads came lent to the
/// client, and how many frames came without a CRC.
fn lent_echoes(net: &TestNet, wire: &str, sizes: &str) -> (u64, u64) {
    let dev = format!("{}+shm:{wire}", net.dev_a());
    let side = || PeerSide { host: &net.a, dev: &dev, env: &[] };
    let out = testpeer_pair(net, PEER, "sizes", side(), side(), &["--level", "rel", "--sizes", sizes]).0;
    let n = sizes.split(',').count();
    assert!(out.contains(&format!("OK {n}")), "{out}");
    let count = |what: &str| out.lines().find_map(|l| l.strip_prefix(what)).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {what} line: {out}"));
    (count("LENT "), count("UNSEALED "))
}

#[test]
fn payloads_from_the_threshold_up_are_lent_and_arrive_intact() {
    let net = TestNet::new(1500);
    let wire = format!("{}-lent", net.a);
    // Below the threshold: framed. From it up: lent, fragment by fragment
    // (the engine sends a process on the wire fragments of nearly 64 KiB:
    // 4096 B to 65537 B lend one each, their short tails are framed; 1 MiB
    // lends 16 and frames its tail).
    assert_eq!(lent_echoes(&net, &format!("{wire},lend=4096"), "0,1,4095").0, 0, "nothing reaches the threshold");
    let (lent, _) = lent_echoes(&net, &format!("{wire},lend=4096"), "0,1,4095,4096,65535,65536,65537,1048576");
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 4 + 16, "lent fragments");
}

#[test]
fn without_lending_payloads_are_copied() {
    let net = TestNet::new(1500);
    let wire = format!("{}-copied", net.a);
    let (lent, unsealed) = lent_echoes(&net, &wire, "4096,65536,1048576");
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 0);
    // The echoes of 4 KiB, 64 KiB and 1 MiB: 1 + 2 + 17 frames at least
    // (fragments of nearly 64 KiB), every one without a CRC.
    assert!(unsealed >= 20, "frames over shared memory carry no CRC: {unsealed} came without");
}

/// A NIC whose MTU exceeds the wire's (veth's largest, 65,535 bytes,
/// against the wire's 65,472) leaves the wire's own: fragments to a
/// process on the wire are cut for the wire (they were cut for the NIC,
/// too long for a slot, and never went: the connection stalled).
#[test]
fn a_nic_larger_than_the_wire_sends_the_wire_its_own_fragments() {
    let net = TestNet::new(65535);
    let wire = format!("{}-bignic", net.a);
    let (lent, unsealed) = lent_echoes(&net, &wire, "65472,65536,1048576");
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 0);
    assert!(unsealed >= 20, "the echoes went over the wire: {unsealed} frames without a CRC");
}
