//! A composite device of two NICs with routes from the hosts file: hosts a
//! and b are joined by two networks (veth pairs, the second with jumbo
//! frames); each host's composite is its two NICs under the first one's
//! MAC, and its hosts file says the other host is reached through the
//! second NIC, at its address there. Two `via-testpeer`s move 0 B to 1 MiB
//! both ways over a reliable VI, contents checked; the frames went through
//! the second network. Without the route they go through the first.
//! Needs root.

use via_tests::{testpeer_pair, PeerSide, TestNet};

const PEER: &str = env!("CARGO_BIN_EXE_via-testpeer");
const SIZES: &str = "0,1,1500,8986,8987,65536,1048576";

/// Runs the sizes scenario between a (server) and b (client) on two-NIC
/// composites, each host with the hosts file line `routes(host)`;
/// returns the client's frames sent through NICs 0 and 1.
fn frames_by_nic(net: &TestNet, links: &(String, String), routes: impl Fn(&str) -> String) -> (u64, u64) {
    let dir = std::env::temp_dir().join(format!("via-routes-{}-{}", std::process::id(), net.a));
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = |h: &str| {
        let p = dir.join(format!("hosts-{h}"));
        std::fs::write(&p, routes(h)).unwrap();
        p
    };
    let (hosts_a, hosts_b) = (hosts("a"), hosts("b"));
    let dev_a = format!("{}+/dev/via_{}", net.dev_a(), links.0);
    let dev_b = format!("{}+/dev/via_{}", net.dev_b(), links.1);
    let (env_a, env_b) = ([("VIA_HOSTS", hosts_a.as_os_str())], [("VIA_HOSTS", hosts_b.as_os_str())]);
    let (server, client) = (PeerSide { host: &net.a, dev: &dev_a, env: &env_a }, PeerSide { host: &net.b, dev: &dev_b, env: &env_b });
    let out = testpeer_pair(net, PEER, "sizes", server, client, &["--level", "rel", "--sizes", SIZES]).0;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.contains("OK 7"), "{out}");
    let dev = out.lines().find_map(|l| l.strip_prefix("DEVICE ")).unwrap_or_else(|| panic!("no DEVICE line: {out}"));
    let count = |name: &str| dev.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{name}="))).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {dev}"));
    (count("composite_tx_nic0"), count("composite_tx_nic1"))
}

#[test]
fn the_hosts_file_routes_the_peer_through_the_second_nic() {
    let net = TestNet::new(1500);
    let links = net.add_link(9000);
    let mac = |ns: &str, ifname: &str| net.mac_of(ns, ifname);
    let (ma1, mb1) = (mac(&net.a, &net.va), mac(&net.b, &net.vb));
    let (ma2, mb2) = (mac(&net.a, &links.0), mac(&net.b, &links.1));
    assert!(!ma1.is_empty() && !mb2.is_empty());
    // Routed: b's frames to a go through the second network. (The first
    // carries nothing of theirs: connection set-up is unicast too.) At
    // MTU 9000, 1 MiB is over a hundred frames.
    let routed = |h: &str| if h == "a" { format!("b {mb1} /dev/via_{}={mb2}\n", links.0) } else { format!("a {ma1} /dev/via_{}={ma2}\n", links.1) };
    let (nic0, nic1) = frames_by_nic(&net, &links, routed);
    assert!(nic1 > 100 && nic0 == 0, "routed: {nic0} frames through the first NIC, {nic1} through the second");
    // Unrouted: the same names, no routes: everything takes the first.
    let plain = |h: &str| if h == "a" { format!("b {mb1}\n") } else { format!("a {ma1}\n") };
    let (nic0, nic1) = frames_by_nic(&net, &links, plain);
    assert!(nic0 > 100 && nic1 == 0, "unrouted: {nic0} frames through the first NIC, {nic1} through the second");
    // Striped: the hosts files name the peer on both networks. Its large
    // messages go over both, at the smaller MTU (1 MiB is over 700
    // frames), and arrive whole and in order.
    let striped = |h: &str| {
        let (me, va, vb) = if h == "a" { (("b", &mb1, &mb2), &net.va, &links.0) } else { (("a", &ma1, &ma2), &net.vb, &links.1) };
        format!("{} {} /dev/via_{va}={} /dev/via_{vb}={}\n", me.0, me.1, me.1, me.2)
    };
    let (nic0, nic1) = frames_by_nic(&net, &links, striped);
    assert!(nic0 > 300 && nic1 > 300, "striped: {nic0} frames through the first NIC, {nic1} through the second");
}
