//! Area "connections": attribute checks at connect time and what
//! ConnectWait tells the server.

use super::{Ctx, Rule, DISC, MTS, T};
use crate::check;
use std::time::Duration;
use via_user::{Reliability, ViAttributes, VipReturn};

macro_rules! rule {
    ($name:ident, $text:expr, $t:expr, $i:expr) => {
        Rule { name: stringify!($name), area: "connections", text: $text, target: $t, initiator: $i, target_passive: false }
    };
}

pub fn rules() -> Vec<Rule> {
    vec![
        rule!(mismatched_reliability_level_gives_invalid_reliability_level,
            "A client and server VI of different reliability levels do not connect: both ConnectAccept and ConnectRequest return INVALID_RELIABILITY_LEVEL.",
            |c| mismatch_target(c, VipReturn::InvalidReliabilityLevel), |c| mismatch_initiator(c, ViAttributes { reliability: Reliability::Unreliable, ..base(c) }, VipReturn::InvalidReliabilityLevel)),
        rule!(mismatched_max_transfer_size_gives_invalid_mtu,
            "VIs of different MaxTransferSize do not connect: INVALID_MTU on both sides.",
            |c| mismatch_target(c, VipReturn::InvalidMtu), |c| mismatch_initiator(c, ViAttributes { max_transfer_size: MTS / 2, ..base(c) }, VipReturn::InvalidMtu)),
        rule!(mismatched_rdma_read_enable_gives_invalid_rdmaread,
            "VIs that differ in EnableRdmaRead do not connect: INVALID_RDMAREAD on both sides.",
            |c| mismatch_target(c, VipReturn::InvalidRdmaRead), |c| mismatch_initiator(c, ViAttributes { enable_rdma_read: true, ..base(c) }, VipReturn::InvalidRdmaRead)),
        rule!(connect_wait_reports_the_clients_address_and_attributes,
            "ConnectWait hands the server the client's NIC address and VI attributes (reliability level, MaxTransferSize, RDMA enables) before it accepts.",
            wait_target, wait_initiator),
    ]
}

fn base(c: &Ctx) -> ViAttributes {
    c.attrs(Reliability::ReliableDelivery, false, false)
}

fn mismatch_target(c: &mut Ctx, want: VipReturn) {
    let vi = c.vi(base(c));
    let req = c.ok(c.nic.connect_wait(&c.disc(DISC), T), "ConnectWait");
    let e = c.nic.accept(&req, &vi).err().map(|e| e.code);
    check!(c, e == Some(want), "ConnectAccept gave {e:?}, expected {want:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "the server VI is {:?}", vi.state());
    c.heard();
}

fn mismatch_initiator(c: &mut Ctx, attrs: ViAttributes, want: VipReturn) {
    let mut vi = c.vi(attrs);
    let e = vi.connect_retrying(c.peer.unwrap(), &c.disc(DISC), Duration::from_secs(20)).err().map(|e| e.code);
    check!(c, e == Some(want), "ConnectRequest gave {e:?}, expected {want:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "the client VI is {:?}", vi.state());
    c.pass();
}

fn wait_target(c: &mut Ctx) {
    let vi = c.vi(c.attrs(Reliability::ReliableReception, true, true));
    let req = c.ok(c.nic.connect_wait(&c.disc(DISC), T), "ConnectWait");
    c.tell(&req.remote_mac.to_string());
    check!(c, req.reliability == Some(Reliability::ReliableReception), "reliability {:?}", req.reliability);
    check!(c, req.max_transfer_size == MTS, "MaxTransferSize {}", req.max_transfer_size);
    check!(c, req.enable_rdma_write && req.enable_rdma_read, "RDMA enables {} {}", req.enable_rdma_write, req.enable_rdma_read);
    c.ok(c.nic.accept(&req, &vi), "ConnectAccept");
    c.heard();
}

fn wait_initiator(c: &mut Ctx) {
    let mut vi = c.vi(c.attrs(Reliability::ReliableReception, true, true));
    c.connect(&mut vi);
    let seen = c.heard();
    check!(c, seen == c.nic.mac().to_string(), "the server saw address {seen}, ours is {}", c.nic.mac());
    c.pass();
}

/// Peer-to-peer rules (`VipConnectPeerRequest` / `Done` / `Wait`).
pub fn peer_rules() -> Vec<Rule> {
    vec![
        rule!(peer_to_peer_request_connects_both_vis,
            "Two VIs that each ConnectPeerRequest the other (own discriminator, the peer's) become connected to each other: ConnectPeerDone reports NOT_DONE then done on one side, ConnectPeerWait returns on the other, and messages flow both ways.",
            peer_target, peer_initiator),
        rule!(peer_to_peer_mismatched_attributes_are_refused_on_both_sides,
            "Peer requests whose VIs differ in reliability level end on both sides with INVALID_RELIABILITY_LEVEL, and both VIs stay Idle.",
            peer_mismatch_target, peer_mismatch_initiator),
        rule!(peer_request_without_a_peer_times_out,
            "A peer request that no peer answers ends with TIMEOUT at its timeout and leaves the VI Idle; a client/server ConnectRequest to a discriminator that only a peer request uses gets NO_MATCH.",
            peer_alone_target, peer_alone_initiator),
    ]
}

fn peer_target(c: &mut Ctx) {
    let mut vi = c.vi(base(c));
    c.post_control_recv(&mut vi);
    let mac: via_user::MacAddr = c.ok(c.heard().parse(), "the initiator's address");
    c.ok(vi.connect_peer_request(mac, &c.disc(b"left"), &c.disc(b"right"), T), "ConnectPeerRequest");
    c.ok(vi.connect_peer_wait(), "ConnectPeerWait");
    check!(c, vi.state() == via_user::ViPhase::Connected, "state {:?}", vi.state());
    check!(c, c.recv_control(&mut vi) == b"from the right", "message from the peer");
    c.send_control(&mut vi, b"from the left");
    c.heard();
}

fn peer_initiator(c: &mut Ctx) {
    let mut vi = c.vi(base(c));
    c.post_control_recv(&mut vi);
    // Ask first, then let the target know where we are: until it knows,
    // it cannot have asked, so ConnectPeerDone says NOT_DONE. (Polled
    // before telling it: after, a slow machine may let the whole exchange
    // finish before our first poll.)
    c.ok(vi.connect_peer_request(c.peer.unwrap(), &c.disc(b"right"), &c.disc(b"left"), T), "ConnectPeerRequest");
    check!(c, !c.ok(vi.connect_peer_done(), "ConnectPeerDone"), "ConnectPeerDone said done before the peer had even asked");
    c.tell(&c.nic.mac().to_string());
    let mut polls = 0;
    while !c.ok(vi.connect_peer_done(), "ConnectPeerDone") {
        polls += 1;
        check!(c, polls < 10_000_000, "never connected");
    }
    check!(c, vi.state() == via_user::ViPhase::Connected, "state {:?}", vi.state());
    c.send_control(&mut vi, b"from the right");
    check!(c, c.recv_control(&mut vi) == b"from the left", "message from the peer");
    c.pass();
}

fn peer_mismatch_target(c: &mut Ctx) {
    let mut vi = c.vi(base(c));
    let mac: via_user::MacAddr = c.ok(c.heard().parse(), "the initiator's address");
    c.ok(vi.connect_peer_request(mac, &c.disc(b"left"), &c.disc(b"right"), T), "ConnectPeerRequest");
    let e = vi.connect_peer_wait().err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidReliabilityLevel), "ConnectPeerWait gave {e:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "state {:?}", vi.state());
    c.tell("checked");
    c.heard();
}

fn peer_mismatch_initiator(c: &mut Ctx) {
    let mut vi = c.vi(ViAttributes { reliability: Reliability::ReliableReception, ..base(c) });
    c.tell(&c.nic.mac().to_string());
    c.ok(vi.connect_peer_request(c.peer.unwrap(), &c.disc(b"right"), &c.disc(b"left"), T), "ConnectPeerRequest");
    let e = vi.connect_peer_wait().err().map(|e| e.code);
    check!(c, e == Some(VipReturn::InvalidReliabilityLevel), "ConnectPeerWait gave {e:?}");
    check!(c, vi.state() == via_user::ViPhase::Idle, "state {:?}", vi.state());
    check!(c, c.heard() == "checked", "the target's check");
    c.pass();
}

fn peer_alone_target(c: &mut Ctx) {
    // A peer request for someone else: it must not answer a client's ConnectRequest.
    let mut vi = c.vi(base(c));
    c.ok(vi.connect_peer_request(via_user::MacAddr([2, 0, 0, 0, 0, 9]), &c.disc(b"alone"), &c.disc(b"nobody"), T), "ConnectPeerRequest");
    c.tell("requested");
    c.heard();
}

fn peer_alone_initiator(c: &mut Ctx) {
    check!(c, c.heard() == "requested", "expected requested");
    let mut vi = c.vi(base(c));
    let e = vi.connect(c.peer.unwrap(), &c.disc(b"alone"), Some(Duration::from_secs(5))).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::NoMatch), "a ConnectRequest to a peer request's discriminator: {e:?}");
    let t0 = std::time::Instant::now();
    c.ok(vi.connect_peer_request(c.peer.unwrap(), &c.disc(b"me"), &c.disc(b"nobody here"), Some(Duration::from_millis(300))), "ConnectPeerRequest");
    let e = vi.connect_peer_wait().err().map(|e| e.code);
    check!(c, e == Some(VipReturn::Timeout), "ConnectPeerWait without a peer: {e:?}");
    check!(c, t0.elapsed() >= Duration::from_millis(300), "timed out early: {:?}", t0.elapsed());
    check!(c, vi.state() == via_user::ViPhase::Idle, "state {:?}", vi.state());
    c.pass();
}

/// Name-service rules (`VipNSInit`, `GetHostByName`, `GetHostByAddr`, `NSShutdown`).
pub fn name_rules() -> Vec<Rule> {
    let r = |name, text, t, i| Rule { name, area: "name service", text, target: t, initiator: i, target_passive: false };
    vec![
        r("name_service_discovers_a_host_not_in_the_hosts_file",
            "VipNSGetHostByName of a name the hosts file lacks asks the segment: the endpoint that answers for the name (set by VipNSInit) gives its address; a name nobody has gives ERROR_NAMESERVICE.",
            names_target as fn(&mut Ctx), discover_initiator as fn(&mut Ctx)),
        r("name_service_gives_the_name_of_an_address",
            "VipNSGetHostByAddr gives the name of an address: from the hosts file when it has one, else from the endpoint itself; after VipNSShutdown lookups start afresh and still work.",
            names_target, reverse_initiator),
    ]
}

fn names_target(c: &mut Ctx) {
    c.ok(c.nic.ns_init(Some(vec![c.name("conform-target"), c.name("alias-of-target")])), "VipNSInit");
    c.tell("named");
    c.heard();
}

fn discover_initiator(c: &mut Ctx) {
    check!(c, c.heard() == "named", "expected named");
    std::env::set_var("VIA_HOSTS", "/nonexistent/via-hosts"); // nothing from a file
    let e = c.nic.ns_init(None).err().map(|e| e.code);
    check!(c, e == Some(VipReturn::ErrorNameService), "a missing VIA_HOSTS file: {e:?}");
    let dir = std::env::temp_dir().join(format!("via-conform-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let hosts = crate::hosts_file(&dir, &[]);
    std::env::set_var("VIA_HOSTS", &hosts);
    c.ok(c.nic.ns_init(None), "VipNSInit");
    let mac = c.ok(c.nic.lookup_host(&c.name("alias-of-target")), "VipNSGetHostByName by discovery");
    check!(c, Some(mac) == c.peer, "discovered {mac}, the target is {:?}", c.peer);
    let e = c.nic.lookup_host("no-such-host").err().map(|e| e.code);
    check!(c, e == Some(VipReturn::ErrorNameService), "an unknown name: {e:?}");
    let _ = std::fs::remove_dir_all(&dir);
    c.pass();
}

fn reverse_initiator(c: &mut Ctx) {
    check!(c, c.heard() == "named", "expected named");
    let peer = c.peer.unwrap();
    let dir = std::env::temp_dir().join(format!("via-conform-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let hosts = crate::hosts_file(&dir, &[("filehost", &peer.to_string())]);
    std::env::set_var("VIA_HOSTS", &hosts);
    c.ok(c.nic.ns_init(None), "VipNSInit");
    let n = c.ok(c.nic.lookup_name(peer), "VipNSGetHostByAddr (hosts file)");
    check!(c, n == "filehost", "the hosts file says filehost, got {n}");
    c.nic.ns_shutdown();
    let empty = crate::hosts_file(&dir, &[]);
    std::env::set_var("VIA_HOSTS", &empty);
    let n = c.ok(c.nic.lookup_name(peer), "VipNSGetHostByAddr (asking the address)");
    check!(c, n == c.name("conform-target"), "the endpoint calls itself {}, got {n}", c.name("conform-target"));
    let _ = std::fs::remove_dir_all(&dir);
    c.pass();
}
