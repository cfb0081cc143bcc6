//! Loss recovery on real links: two test hosts whose software NICs lose,
//! duplicate, reorder and corrupt frames on transmit (`<device>?loss=...`,
//! a `FaultyDevice`: this kernel has no `tc netem`), one `via-testpeer` on
//! each. Reliable VIs move messages from 0 B to 1 MiB both ways, one at a
//! time, contents and lengths checked (a duplicate, a stale or a corrupted
//! fragment would fail them), at 1 %, 5 % and 20 % loss. At both levels,
//! thousands of messages one way over a link that corrupts one frame in
//! ten: nothing corrupted is ever delivered (frames carry a CRC-32C, which
//! the receiver checks, on a software NIC), and a reliable VI delivers
//! every message. And 100 000 messages of random lengths streamed one way,
//! 16 in flight, over a clean link and over links that lose, reorder,
//! duplicate, corrupt or delay frames: every one arrives exactly once, in
//! order, intact. Needs root.

use via_tests::{testpeer_pair, PeerSide, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");
const SIZES: &str = "0,1,1435,1436,1437,1500,2879,65536,1048576";

/// Runs the `sizes` scenario on faulty devices; returns the client's stdout.
fn sizes_with_faults(loss: f64, seed: u32) -> String {
    let net = TestNet::new(1500);
    let faults = |s: u32| format!("?loss={loss},dup=0.01,reorder=0.02,corrupt=0.01,seed={s}");
    let (dev_a, dev_b) = (format!("{}{}", net.dev_a(), faults(seed)), format!("{}{}", net.dev_b(), faults(seed + 1)));
    let (server, client) = (PeerSide { host: &net.a, dev: &dev_a, env: &[] }, PeerSide { host: &net.b, dev: &dev_b, env: &[] });
    testpeer_pair(&net, PEER, "sizes", server, client, &["--level", "rel", "--sizes", SIZES]).0
}

#[test]
fn reliable_delivery_survives_1_5_and_20_percent_loss() {
    for (loss, seed) in [(0.01, 11), (0.05, 21), (0.20, 31)] {
        let out = sizes_with_faults(loss, seed);
        assert!(out.contains("OK 9"), "at {loss} loss: {out}");
        // The faults did happen, and were recovered from.
        let link: Vec<u64> = out.lines().find_map(|l| l.strip_prefix("LINK ")).map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_default();
        assert!(link.len() == 3 && link[0] > 0 && link[1] > 0, "at {loss} loss the client lost frames and retransmitted: {out}");
        assert!(link[2] > 0, "at {loss} loss the client dropped corrupted frames: {out}");
    }
}

/// `count` messages one way from b to a at `level`, over links that
/// corrupt one frame in ten (and lose one in a hundred); returns the
/// server's DELIVERED, FAILED, BAD_CHECKSUM and NO_RECEIVE counts. The
/// server fails the run if any delivered message differs from what was
/// sent.
fn oneway_corrupted(level: &str, count: usize) -> [u64; 4] {
    let net = TestNet::new(1500);
    let faults = |s: u32| format!("?loss=0.01,corrupt=0.1,seed={s}");
    let (dev_a, dev_b) = (format!("{}{}", net.dev_a(), faults(41)), format!("{}{}", net.dev_b(), faults(42)));
    let n = count.to_string();
    let args = ["--level", level, "--sizes", "1,100,1000,1422,1423,2000,4000", "--count", &n];
    let (server, client) = (PeerSide { host: &net.a, dev: &dev_a, env: &[] }, PeerSide { host: &net.b, dev: &dev_b, env: &[] });
    let out = testpeer_pair(&net, PEER, "oneway", server, client, &args).1;
    let words: Vec<u64> = out.lines().find_map(|l| l.strip_prefix("DELIVERED ")).map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_default();
    assert_eq!(words.len(), 4, "{out}");
    [words[0], words[1], words[2], words[3]]
}

#[test]
fn corrupted_frames_are_never_delivered() {
    // Unreliable: what arrives is intact (the server checks every message
    // it delivers), some messages are lost, and corrupted frames were seen
    // and dropped.
    let [delivered, failed, bad, _] = oneway_corrupted("unrel", 3000);
    println!("unreliable, 3000 sent: {delivered} delivered intact, {failed} failed, {bad} frames failed their checksum");
    // (How many arrive depends on how fast the server reposts receives:
    // the unreliable sender does not wait for it.)
    assert!(delivered > 0 && bad > 0, "unreliable: {delivered} delivered intact, {failed} failed, {bad} bad checksums");
    // Reliable: every message, intact.
    let [delivered, failed, bad, none_posted] = oneway_corrupted("rel", 3000);
    println!("reliable, 3000 sent: {delivered} delivered intact, {failed} failed, {bad} frames failed their checksum");
    assert!(delivered == 3000 && failed == 0 && bad > 0, "reliable: {delivered} delivered, {failed} failed, {bad} bad checksums, {none_posted} without a receive");
}

/// Streams `count` messages of 0 to 4000 bytes (random) from b to a over
/// links with `faults` (a FaultyDevice spec, or "" for a clean link);
/// returns the client's seconds and the LINK counters (lost,
/// retransmits, bad checksums).
fn stream(faults: &str, seed: u32, count: usize) -> (f64, [u64; 3]) {
    let net = TestNet::new(1500);
    let spec = |s: u32| if faults.is_empty() { String::new() } else { format!("?{faults},seed={s}") };
    let (dev_a, dev_b) = (format!("{}{}", net.dev_a(), spec(seed)), format!("{}{}", net.dev_b(), spec(seed + 1)));
    let n = count.to_string();
    let args = ["--level", "rel", "--sizes", "random:4000", "--count", &n, "--window", "16"];
    let (server, client) = (PeerSide { host: &net.a, dev: &dev_a, env: &[] }, PeerSide { host: &net.b, dev: &dev_b, env: &[] });
    let (out, server_out) = testpeer_pair(&net, PEER, "stream", server, client, &args);
    assert!(server_out.contains(&format!("STREAMED {count} ")), "with {faults:?}: {server_out}");
    let secs = out.lines().find_map(|l| l.strip_prefix("SENT ")).and_then(|l| l.split_whitespace().nth(2)?.parse().ok()).unwrap_or_else(|| panic!("{out}"));
    let link: Vec<u64> = out.lines().find_map(|l| l.strip_prefix("LINK ")).map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_default();
    assert_eq!(link.len(), 3, "{out}");
    (secs, [link[0], link[1], link[2]])
}

#[test]
fn a_hundred_thousand_messages_arrive_exactly_once_in_order_under_every_fault() {
    const COUNT: usize = 100_000;
    let conditions = [
        ("", 51),
        ("loss=0.01", 52),
        ("loss=0.05", 53),
        ("loss=0.2", 54),
        ("reorder=0.05", 55),
        ("dup=0.05", 56),
        ("corrupt=0.01", 57),
        ("delay=1000", 58),
    ];
    for (faults, seed) in conditions {
        let (secs, [lost, retransmits, bad]) = stream(faults, seed, COUNT);
        println!("{COUNT} messages with {:<14} {secs:7.2} s, client's link: {lost} lost, {retransmits} retransmitted, {bad} bad checksums", if faults.is_empty() { "no faults" } else { faults });
        // The faults happened (and were recovered from, or the server
        // would have failed).
        if faults.starts_with("loss") {
            assert!(lost > 0 && retransmits > 0, "with {faults}: {lost} lost, {retransmits} retransmitted");
        }
        if faults.starts_with("corrupt") {
            assert!(bad > 0, "with {faults}: no bad checksums seen");
        }
    }
}
