//! A soak: 64 VIs between two hosts (Reliable Delivery and Reliable
//! Reception) with mixed traffic — sends of random lengths, RDMA writes and
//! RDMA reads of them back — for 20 seconds over links that lose and
//! reorder 1 % of frames (`via-testpeer soak`). Every message arrives
//! exactly once, in order and intact; every read returns what was written;
//! the resident memory of both processes is flat from a quarter of the run
//! to its end; the counters (frames, retransmissions, drops by reason) are
//! read through the API. Needs root.

use via_tests::{testpeer_pair, PeerSide, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");
/// Growth of the resident set allowed from a quarter of the run to its end.
const RSS_SLACK_KB: u64 = 2048;

fn words(out: &str, key: &str) -> Vec<u64> {
    out.lines().find_map(|l| l.strip_prefix(key)).map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect()).unwrap_or_else(|| panic!("no {key:?} in {out}"))
}

fn counter(out: &str, name: &str) -> u64 {
    let line = out.lines().find_map(|l| l.strip_prefix("COUNTERS ")).unwrap_or_else(|| panic!("no counters in {out}"));
    line.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).unwrap_or_else(|| panic!("no counter {name} in {line}"))
}

#[test]
fn sixty_four_vis_of_mixed_traffic_keep_memory_flat() {
    let net = TestNet::new(1500);
    let faults = |s: u32| format!("?loss=0.01,reorder=0.01,seed={s}");
    let (dev_a, dev_b) = (format!("{}{}", net.dev_a(), faults(61)), format!("{}{}", net.dev_b(), faults(62)));
    let (server, client) = (PeerSide { host: &net.a, dev: &dev_a, env: &[] }, PeerSide { host: &net.b, dev: &dev_b, env: &[] });
    let (c, s) = testpeer_pair(&net, PEER, "soak", server, client, &["--seconds", "20"]);
    let rounds = words(&c, "ROUNDS ")[0];
    let messages = words(&s, "MESSAGES ")[0];
    let (crss, srss) = (words(&c, "RSS "), words(&s, "RSS "));
    println!("{rounds} rounds of 64 sends, RDMA writes and RDMA reads; the server took {messages} messages");
    println!("resident kB, a quarter in -> end: client {} -> {}, server {} -> {}", crss[0], crss[1], srss[0], srss[1]);
    println!("client: {} frames sent, {} retransmitted, {} RTO expiries; dropped: {} duplicate, {} out of order (held), {} stale",
        counter(&c, "tx_frames"), counter(&c, "retransmits"), counter(&c, "rto_expiries"), counter(&c, "rx_duplicate"), counter(&c, "rx_out_of_order"), counter(&c, "rx_stale"));
    assert!(rounds > 0 && messages == rounds * 64, "every send of every round arrives exactly once: {rounds} rounds, {messages} messages");
    assert!(counter(&c, "faults_lost") > 0 && counter(&c, "retransmits") > 0, "the link lost frames and they were sent again");
    for (who, r) in [("client", &crss), ("server", &srss)] {
        assert!(r[0] > 0 && r[1] <= r[0] + RSS_SLACK_KB, "{who}'s resident set grew from {} kB to {} kB", r[0], r[1]);
    }
}
