//! Registered memory copied once between processes of one host: two
//! `via-testpeer`s on one test host, each on a composite device whose
//! shared-memory wire lends payloads (`<nic>+shm:<wire>,lend=<bytes>`),
//! move every size from 0 B to 1 MiB both ways, contents checked, and the
//! payloads from the lending threshold up arrive lent (read from the
//! sender's memory with `process_vm_readv`), none below it or with lending
//! off; a message longer than a frame goes whole, as one lent frame. By
//! default the wire lends from 64 KiB on, where the kernel allows it.
//! Frames that cross the wire carry no CRC (memory cannot corrupt them;
//! the device vouches for each), and arrive intact all the same.
//! Needs root.

use via_tests::{testpeer_pair, PeerSide, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");

/// Runs the `sizes` scenario between two processes of host a on `wire`
/// (its options included); returns how many payloads came lent to the
/// client, and how many frames came without a CRC.
fn lent_echoes(net: &TestNet, wire: &str, sizes: &str) -> (u64, u64) {
    let (lent, unsealed, _) = lent_echoes_out(net, wire, sizes);
    (lent, unsealed)
}

/// [`lent_echoes`], and the client's device counters (`name=value`).
fn lent_echoes_out(net: &TestNet, wire: &str, sizes: &str) -> (u64, u64, String) {
    let dev = format!("{}+shm:{wire}", net.dev_a());
    let side = || PeerSide { host: &net.a, dev: &dev, env: &[] };
    let out = testpeer_pair(net, PEER, "sizes", side(), side(), &["--level", "rel", "--sizes", sizes]).0;
    let n = sizes.split(',').count();
    assert!(out.contains(&format!("OK {n}")), "{out}");
    let count = |what: &str| out.lines().find_map(|l| l.strip_prefix(what)).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {what} line: {out}"));
    let device = out.lines().find_map(|l| l.strip_prefix("DEVICE ")).unwrap_or_default().to_string();
    (count("LENT "), count("UNSEALED "), device)
}

#[test]
fn payloads_from_the_threshold_up_are_lent_and_arrive_intact() {
    let net = TestNet::new(1500);
    let wire = format!("{}-lent", net.a);
    // Below the threshold: framed. From it up: lent, each message as one
    // frame (the engine cuts fragments of nearly 64 KiB for a process on
    // the wire, but a message the wire lends goes whole: 4096 B to 1 MiB
    // lend one frame each).
    assert_eq!(lent_echoes(&net, &format!("{wire},lend=4096"), "0,1,4095").0, 0, "nothing reaches the threshold");
    let (lent, unsealed) = lent_echoes(&net, &format!("{wire},lend=4096"), "0,1,4095,4096,65535,65536,65537,1048576");
    assert_eq!(lent, 5, "one lent frame a message");
    // The echoes of 8 messages and the control frames: had 65536 B and
    // more been cut, 2 + 2 + 17 frames would have come for them alone.
    assert!(unsealed < 8 + 10, "{unsealed} frames");
    // A threshold above a frame's payload: a message reaching it goes
    // whole; a shorter one (but longer than a frame) is cut and framed.
    let (lent, _) = lent_echoes(&net, &format!("{wire},lend=262144"), "65537,262143,262144,1048576");
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 2, "262144 and 1048576 B lent whole");
}

/// A payload of two chunks or more is copied by both ends: the client,
/// waiting for its echo, writes chunks of its message into the server's
/// buffer while the server reads the rest (`via_device::shared_copy`),
/// and every byte arrives (the scenario checks each echo's contents).
#[test]
fn the_sender_writes_a_share_of_a_large_lent_payload() {
    let net = TestNet::new(1500);
    let wire = format!("{}-shared", net.a);
    let sizes = ["1048576"; 16].join(",");
    let (lent, _, device) = lent_echoes_out(&net, &format!("{wire},lend=65536"), &sizes);
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 16);
    let written: u64 = device.split(' ').find_map(|kv| kv.strip_prefix("shm_lent_chunks_written=")).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no chunk count: {device}"));
    // Each 1 MiB is 8 chunks; a client scheduled at all while the server
    // copies takes some of them.
    assert!(written > 0 && written < 16 * 8, "the client wrote {written} of {} chunks", 16 * 8);
}

#[test]
fn by_default_messages_from_64_kib_are_lent_whole() {
    let net = TestNet::new(1500);
    let wire = format!("{}-default", net.a);
    let (lent, _) = lent_echoes(&net, &wire, "4096,65535,65536,1048576");
    via_softnic::shm::remove_wire(&wire);
    // The kernel may forbid reading another process's memory (Yama's
    // ptrace scope 2 or 3, a seccomp filter): then nothing is lent.
    let want = if via_softnic::shm::lending_possible() { 2 } else { 0 };
    assert_eq!(lent, want, "lending possible here: {}", via_softnic::shm::lending_possible());
}

#[test]
fn without_lending_payloads_are_copied() {
    let net = TestNet::new(1500);
    let wire = format!("{}-copied", net.a);
    let (lent, unsealed) = lent_echoes(&net, &format!("{wire},lend=off"), "4096,65536,1048576");
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
    let (lent, unsealed) = lent_echoes(&net, &format!("{wire},lend=off"), "65472,65536,1048576");
    via_softnic::shm::remove_wire(&wire);
    assert_eq!(lent, 0);
    assert!(unsealed >= 20, "the echoes went over the wire: {unsealed} frames without a CRC");
}
