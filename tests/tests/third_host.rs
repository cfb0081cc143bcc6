//! A third host on the segment (issue 22): A and B are connected by a
//! reliable VI with RDMA write and read enabled; M, on the same hub, sees
//! their frames and forges its own (`via_tests::attack`). Real namespaces,
//! a real bridge, real AF_PACKET sockets.
//!
//! Without a key, the attacks that need none fail, each asserted on the
//! victim's state and counters: a ConnAccept or ConnReject from a host
//! that was not asked, replayed RDMA read requests (amplification),
//! duplicate read requests probing handles, a Disconnect addressed to
//! endpoint 0, a broadcast name query with an empty name.
//!
//! The forged-data attacks (an RDMA write into B's memory, a send to B as
//! if from A, a forged frame taking A's sequence number) need the frame's
//! fields alone, all in clear: without a key they succeed, and the tests
//! `unauthenticated_*` assert that they do, documenting what the
//! unauthenticated wire trusts. Each is a scenario function taking the
//! host options (`HostOptions::key`), so that the variant with a cluster
//! secret runs the same attack and asserts it fails.

use std::path::Path;
use via_kernel_agent::wire::{flags, ConnRepr, Frame, HeaderRepr, Kind, ANY_ENDPOINT};
use via_kernel_agent::MacAddr;
use via_tests::attack::{next_in_stream, Attacker, Connected, Host, HostOptions, Segment, Station, SERVICE, STEP};
use via_user::{AsyncErrorKind, ViPhase};

/// The three hosts, the attacker listening, A and B connected.
fn setup(key: Option<&Path>) -> (Segment, Attacker, Connected) {
    let seg = Segment::new();
    let m = Attacker::open(&seg);
    let c = Connected::new(&seg, HostOptions { key });
    (seg, m, c)
}

/// The last RDMA write of A's that M saw (its target's handle and address).
fn sniffed_write(m: &Attacker, a: MacAddr) -> HeaderRepr {
    *m.seen_headers(|h| h.src_mac == a && h.kind == Kind::RdmaWrite as u8).last().expect("the attacker saw A's RDMA write")
}

/// The last RDMA read request of A's that M saw.
fn sniffed_read_request(m: &mut Attacker, a: MacAddr) -> HeaderRepr {
    m.drain();
    *m.seen_headers(|h| h.src_mac == a && h.kind == Kind::RdmaReadReq as u8).last().expect("the attacker saw A's RDMA read request")
}

// ---- forged data: what the unauthenticated wire trusts ----

/// M forges an RDMA write "from A" of `payload` into B's memory at 1024
/// (the handle and address learnt from A's genuine write at 0).
fn forge_rdma_write(m: &mut Attacker, c: &mut Connected, payload: &[u8]) {
    c.rdma_write(&[0x11; 512], 0);
    let last = m.last_sequenced(c.a.mac, c.b.mac);
    let write = sniffed_write(m, c.a.mac);
    let h = HeaderRepr {
        kind: Kind::RdmaWrite as u8,
        flags: last.flags & flags::RELIABLE | flags::FIRST | flags::LAST,
        msg_len: payload.len() as u32,
        rdma_addr: write.rdma_addr + 1024,
        rdma_handle: write.rdma_handle,
        ..next_in_stream(&last)
    };
    m.forge(&h, payload);
}

#[test]
fn unauthenticated_a_forged_rdma_write_lands_in_b_memory() {
    let (_seg, mut m, mut c) = setup(None);
    let forged = [0x66u8; 256];
    forge_rdma_write(&mut m, &mut c, &forged);
    let mem = c.mem_b.clone();
    c.b.wait_for("the forged write landing in B's memory", |_| mem.to_vec(1024..1280).unwrap() == forged);
    assert_eq!(c.mem_b.to_vec(0..512).unwrap(), vec![0x11; 512], "A's genuine write");
    assert_eq!((c.a.phase(c.vi_a.id()), c.b.phase(c.vi_b.id())), (ViPhase::Connected, ViPhase::Connected), "neither side noticed");
    assert!(c.b.nic.take_async_errors().is_empty());
}

/// M forges a send "from A" to B: the next PSN and message number.
fn forge_send(m: &mut Attacker, c: &mut Connected, payload: &[u8]) {
    let last = m.last_sequenced(c.a.mac, c.b.mac);
    let h = HeaderRepr { kind: Kind::Data as u8, flags: last.flags & flags::RELIABLE | flags::FIRST | flags::LAST, msg_len: payload.len() as u32, ..next_in_stream(&last) };
    m.forge(&h, payload);
}

#[test]
fn unauthenticated_a_forged_send_is_delivered_as_from_a() {
    let (_seg, mut m, mut c) = setup(None);
    c.post_recv_b(0..4096);
    c.post_recv_b(4096..8192);
    c.send(b"genuine, from A");
    assert_eq!(c.recv_b(0..15), (15, b"genuine, from A".to_vec()));
    forge_send(&mut m, &mut c, b"forged by M");
    let (len, got) = c.recv_b(4096..4096 + 11);
    assert_eq!((len, got.as_slice()), (11, &b"forged by M"[..]), "B took M's message for A's");
    assert_eq!((c.a.phase(c.vi_a.id()), c.b.phase(c.vi_b.id())), (ViPhase::Connected, ViPhase::Connected));
}

#[test]
fn unauthenticated_a_forged_frame_steals_a_sequence_number() {
    let (_seg, mut m, mut c) = setup(None);
    for k in 0..3 {
        c.post_recv_b(k * 4096..(k + 1) * 4096);
    }
    c.send(b"first, from A");
    c.recv_b(0..13);
    forge_send(&mut m, &mut c, b"M took this PSN");
    assert_eq!(c.recv_b(4096..4096 + 15).1, b"M took this PSN");
    let dup = c.b.counters().rx_duplicate;
    // A's real second message has the PSN M used: acknowledged, thrown away.
    c.send(b"second, from A");
    assert!(c.b.counters().rx_duplicate > dup, "A's frame was taken for a duplicate");
    assert!(c.vi_b.recv_done().unwrap().is_none(), "A's second message was never delivered");
    assert_eq!(c.mem_b.to_vec(8192..8192 + 14).unwrap(), vec![0xBB; 14]);
    assert_eq!((c.a.phase(c.vi_a.id()), c.b.phase(c.vi_b.id())), (ViPhase::Connected, ViPhase::Connected), "neither side saw an error");
}

// ---- RDMA read requests replayed ----

/// Bytes A reads, and so B's response to one request.
const READ: usize = 8192;

/// M replays A's read request `forgeries` times, each after B handled
/// the one before (so none is merged with a response still going out).
/// Returns B's response frames meanwhile.
fn replay_read_request(m: &Attacker, c: &Connected, req: &HeaderRepr, forgeries: u64) -> u64 {
    let before = c.b.counters();
    for i in 1..=forgeries {
        m.forge(req, &[]);
        c.b.wait_for("B handling a replayed read request", |k| k.rx_duplicate >= before.rx_duplicate + i);
    }
    let after = c.b.counters();
    (after.tx_frames - before.tx_frames) - (after.acks_sent - before.acks_sent)
}

#[test]
fn replayed_read_requests_are_not_served_again_and_again() {
    let (_seg, mut m, mut c) = setup(None);
    let genuine = c.b.counters();
    c.rdma_read(0, READ);
    let req = sniffed_read_request(&mut m, c.a.mac);
    let retries = via_user::Config::default().retry_limit as u64;
    let before = c.b.counters();
    // B's response to A's one genuine read.
    let per_read = (before.tx_frames - genuine.tx_frames) - (before.acks_sent - genuine.acks_sent);
    assert!(per_read >= READ.div_ceil(1500) as u64, "{per_read} response frames for a read of {READ} bytes");
    let responses = replay_read_request(&m, &c, &req, 100);
    let after = c.b.counters();
    let (replayed, stale) = (after.read_requests_replayed - before.read_requests_replayed, after.read_requests_stale - before.read_requests_stale);
    assert_eq!(replayed + stale, 100, "every replay counted");
    assert!(replayed <= retries, "served again {replayed} times: more than a requester may ask ({retries})");
    assert!(responses <= retries * per_read, "100 forged requests made B send {responses} response frames (one read is {per_read})");
    assert_eq!(c.b.phase(c.vi_b.id()), ViPhase::Connected);
}

#[test]
fn read_requests_older_than_the_reads_remembered_are_never_served_again() {
    let (_seg, mut m, mut c) = setup(None);
    c.rdma_read(0, READ);
    let req = sniffed_read_request(&mut m, c.a.mac);
    // A reads on: as many reads as it could have outstanding, and more.
    let reads = via_user::Config::default().queue_depth + 8;
    c.rdma_reads(16384, 64, reads);
    let before = c.b.counters();
    let responses = replay_read_request(&m, &c, &req, 100);
    let after = c.b.counters();
    assert_eq!(after.read_requests_replayed, before.read_requests_replayed, "an old read served again");
    assert_eq!(after.read_requests_stale - before.read_requests_stale, 100);
    assert_eq!(responses, 0, "B sent response frames for requests it should have dropped");
    assert_eq!(c.b.phase(c.vi_b.id()), ViPhase::Connected);
}

/// M sends a duplicate of A's read request spoiled by `spoil`: a probe
/// of B's memory protection, which costs the connection as any violation.
fn probe(spoil: impl FnOnce(&mut HeaderRepr)) {
    let (_seg, mut m, mut c) = setup(None);
    c.rdma_read(0, READ);
    let mut req = sniffed_read_request(&mut m, c.a.mac);
    spoil(&mut req);
    let before = c.b.counters();
    m.forge(&req, &[]);
    let after = c.b.wait_for("B handling the probe", |k| k.rx_duplicate > before.rx_duplicate);
    assert_eq!(after.rdma_prot_errors, before.rdma_prot_errors + 1, "the probe is a protection violation");
    assert_eq!(c.b.phase(c.vi_b.id()), ViPhase::Error, "the probe breaks the connection");
    assert!(c.b.nic.take_async_errors().iter().any(|e| e.kind == AsyncErrorKind::RdmaReadProt));
    c.a.wait_for("A learning its connection is gone", |k| k.connections_lost >= 1);
    assert_eq!(c.a.phase(c.vi_a.id()), ViPhase::Error);
}

#[test]
fn a_duplicate_read_request_with_a_wrong_handle_breaks_the_connection() {
    probe(|h| h.rdma_handle ^= 0x0100);
}

#[test]
fn a_duplicate_read_request_out_of_bounds_breaks_the_connection() {
    probe(|h| h.rdma_addr += via_tests::attack::MEM as u64);
}

// ---- connection management ----

/// A asks B to connect; B has a ConnectWait (and answers pending) but
/// waits for the test to accept. M answers A's request first with a
/// forged `kind` from its own MAC. Returns (A's counters once it handled
/// M's answer, A's VI phase then, A's connect result after B accepts).
fn forged_answer(kind: Kind) -> (via_user::Counters, ViPhase, via_user::Result<()>) {
    let seg = Segment::new();
    let mut m = Attacker::open(&seg);
    let (a, b) = (Host::open(&seg, Station::A, HostOptions::default()), Host::open(&seg, Station::B, HostOptions::default()));
    let (mut vi_a, vi_b) = (a.vi(), b.vi());
    let id_a = vi_a.id();
    let (go, accept) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let server = &b;
        let b_thread = s.spawn(move || {
            let req = server.nic.connect_wait(SERVICE, Some(STEP)).expect("B waiting");
            // Without the test's go (it failed first), B never accepts.
            if accept.recv_timeout(STEP).is_ok() {
                server.nic.accept(&req, &vi_b).expect("B accepting");
            }
            vi_b
        });
        let b_mac = b.mac;
        // The VI comes back with the result: dropping it would destroy it.
        let a_thread = s.spawn(move || (vi_a.connect(b_mac, SERVICE, Some(STEP)), vi_a));
        let bytes = m.sniff(STEP, "A's connection request", |f| f.kind() == Some(Kind::ConnRequest) && f.src_mac() == a.mac);
        let f = Frame::new_checked(&bytes[..]).unwrap();
        let asked = ConnRepr::parse(f.payload()).unwrap();
        let h = HeaderRepr { dst_mac: a.mac, src_mac: m.mac, kind: kind as u8, dst_ep: f.src_ep(), src_ep: 0x4d4d, dst_vi: f.src_vi(), src_vi: 7, generation: 0x4d4d_4d4d, ..HeaderRepr::default() };
        let before = a.counters();
        m.forge_cm(&h, &ConnRepr { request_id: asked.request_id, discriminator: Vec::new(), ..asked });
        let heard = a.wait_for("A handling M's answer", |k| k.rx_cm_foreign > before.rx_cm_foreign || a.phase(id_a) != ViPhase::ConnectPending);
        let phase = a.phase(id_a);
        go.send(()).unwrap();
        let (connected, _vi_a) = a_thread.join().unwrap();
        b_thread.join().unwrap();
        (heard, phase, connected)
    })
}

#[test]
fn a_connect_accept_from_a_host_not_asked_is_ignored() {
    let (heard, phase, connected) = forged_answer(Kind::ConnAccept);
    assert_eq!(phase, ViPhase::ConnectPending, "A did not connect to M");
    assert_eq!(heard.rx_cm_foreign, 1, "M's accept counted as foreign");
    connected.expect("A connects to B, the host it asked");
}

#[test]
fn a_connect_reject_from_a_host_not_asked_is_ignored() {
    let (heard, phase, connected) = forged_answer(Kind::ConnReject);
    assert_eq!(phase, ViPhase::ConnectPending, "A's request goes on");
    assert_eq!(heard.rx_cm_foreign, 1, "M's reject counted as foreign");
    connected.expect("A connects to B, the host it asked");
}

#[test]
fn a_disconnect_to_endpoint_zero_is_not_for_anyone() {
    let (_seg, mut m, mut c) = setup(None);
    c.rdma_write(&[0x11; 64], 0);
    let last = m.last_sequenced(c.a.mac, c.b.mac);
    let h = HeaderRepr { kind: Kind::Disconnect as u8, dst_ep: ANY_ENDPOINT, ..next_in_stream(&last) };
    let before = c.b.counters();
    m.forge(&h, &[]);
    let after = c.b.wait_for("B handling the Disconnect", |k| k.rx_not_for_us > before.rx_not_for_us || k.connections_lost > before.connections_lost);
    assert_eq!(after.connections_lost, before.connections_lost, "the forged Disconnect broke B's connection");
    assert_eq!(after.rx_not_for_us, before.rx_not_for_us + 1);
    assert_eq!(c.b.phase(c.vi_b.id()), ViPhase::Connected);
    c.post_recv_b(0..4096);
    c.send(b"still connected");
    assert_eq!(c.recv_b(0..15).1, b"still connected");
}

#[test]
fn an_empty_name_broadcast_query_gets_no_answer() {
    let seg = Segment::new();
    let mut m = Attacker::open(&seg);
    let b = Host::open(&seg, Station::B, HostOptions::default());
    let query = |dst: MacAddr| HeaderRepr { dst_mac: dst, src_mac: m.mac, kind: Kind::NameQuery as u8, dst_ep: ANY_ENDPOINT, src_ep: 0x4d4d, ..HeaderRepr::default() };
    let empty = ConnRepr { request_id: 0x4d, ..ConnRepr::default() };
    let before = b.counters();
    m.forge_cm(&query(MacAddr::BROADCAST), &empty);
    let after = b.wait_for("B handling the broadcast query", |k| k.rx_frames > before.rx_frames);
    assert_eq!(after.rx_query_refused, before.rx_query_refused + 1, "refused and counted");
    assert_eq!(after.tx_frames, before.tx_frames, "B answered everybody with its name");
    // Sent to B alone, the same question is answered (VipNSGetHostByAddr).
    m.forge_cm(&query(b.mac), &empty);
    let reply = m.sniff(STEP, "B's name reply", |f| f.kind() == Some(Kind::NameReply) && f.src_mac() == b.mac);
    let f = Frame::new_checked(&reply[..]).unwrap();
    assert!(!ConnRepr::parse(f.payload()).unwrap().discriminator.is_empty(), "B says its name");
}
