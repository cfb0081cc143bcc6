//! A third host on the segment (issue 22): A and B are connected by a
//! reliable VI with RDMA write and read enabled; M, on the same hub, sees
//! their frames and forges its own (`via_tests::attack`). Real namespaces,
//! a real bridge, real AF_PACKET sockets.
//!
//! Each attack is one scenario function taking the cluster secret A and B
//! share (`None`: the unauthenticated wire), run by a keyless test and a
//! keyed one (`keyed_*`). In the keyed runs M tags its forgeries under a
//! key of its own (a different secret's), so they have the authenticated
//! format and fail the check; one test has M send plain CRC frames.
//!
//! Without a key, the attacks that need none fail: a ConnAccept or
//! ConnReject from a host that was not asked, replayed RDMA read requests
//! (amplification), duplicate read requests probing handles, a Disconnect
//! addressed to endpoint 0, a broadcast name query with an empty name.
//! The forged-data attacks (an RDMA write into B's memory, a send to B as
//! if from A, a forged frame taking A's sequence number, a Disconnect to
//! B's endpoint) need the frame's fields alone, all in clear: without a
//! key they succeed, and the tests `unauthenticated_*` assert that they
//! do, documenting what the unauthenticated wire trusts.
//!
//! With a key, none succeeds: each asserts the victim's state, that the
//! victim's `rx_bad_auth` rose by exactly the number of frames M forged
//! (which also proves they reached it), and that genuine traffic between
//! A and B flows intact afterwards.

use std::path::Path;
use via_wire::{flags, ConnRepr, Frame, HeaderRepr, Kind, ANY_ENDPOINT};
use via_wire::MacAddr;
use via_tests::attack::{next_in_stream, stranger_key, Attacker, Connected, Host, HostOptions, SecretFile, Segment, Station, SERVICE, STEP};
use via_user::{AsyncErrorKind, Counters, ViPhase};

/// A and B connected, M listening; dropped connection first, hub last.
struct Rig {
    c: Connected,
    m: Attacker,
    _seg: Segment,
}

/// The three hosts, the attacker listening, A and B connected (sharing
/// `key`; M then tags its forgeries with a key of its own).
fn setup(key: Option<&Path>) -> Rig {
    let seg = Segment::new();
    let mut m = Attacker::open(&seg);
    m.key = key.map(|_| stranger_key());
    let c = Connected::new(&seg, HostOptions { key });
    Rig { c, m, _seg: seg }
}

/// The victim's counters before and after it handled M's frames.
struct Handled {
    before: Counters,
    after: Counters,
}

impl Handled {
    /// How much the counter `k` rose.
    fn rose(&self, k: impl Fn(&Counters) -> u64) -> u64 {
        k(&self.after) - k(&self.before)
    }
}

fn both_connected(c: &Connected) {
    assert_eq!((c.a.phase(c.vi_a.id()), c.b.phase(c.vi_b.id())), (ViPhase::Connected, ViPhase::Connected), "A and B still connected");
}

/// After M's attack: A's RDMA write, send and RDMA read to and from B
/// arrive intact, and both sides are still connected.
fn genuine_traffic_flows(c: &mut Connected) {
    c.rdma_write(&[0x5A; 300], 32768);
    assert_eq!(c.mem_b.to_vec(32768..33068).unwrap(), vec![0x5A; 300], "A's write after the attack");
    c.post_recv_b(49152..53248);
    c.send(b"genuine, after M");
    assert_eq!(c.recv_b(49152..49168), (16, b"genuine, after M".to_vec()), "A's send after the attack");
    c.rdma_read(32768, 300);
    assert_eq!(c.mem_a.to_vec(0..300).unwrap(), vec![0x5A; 300], "A's read after the attack");
    both_connected(c);
    assert!(c.b.nic.take_async_errors().is_empty(), "B saw no error");
}

/// The last RDMA write of A's that M saw (its target's handle and address).
fn sniffed_write(m: &Attacker, a: MacAddr) -> HeaderRepr {
    *m.seen_headers(|h| h.src_mac == a && h.kind == Kind::RdmaWrite as u8).last().expect("the attacker saw A's RDMA write")
}

/// The last RDMA read request of A's that M saw, as sent (tag and all).
fn sniffed_read_request(m: &mut Attacker, a: MacAddr) -> Vec<u8> {
    m.drain();
    let is_req = |b: &Vec<u8>| Frame::new_checked(&b[..]).is_ok_and(|f| f.src_mac() == a && f.kind() == Some(Kind::RdmaReadReq));
    m.seen.iter().rfind(|b| is_req(b)).cloned().expect("the attacker saw A's RDMA read request")
}

fn header_of(bytes: &[u8]) -> HeaderRepr {
    HeaderRepr::parse(&Frame::new_checked(bytes).unwrap())
}

// ---- forged data ----

/// M forges an RDMA write "from A" of `FORGED` into B's memory at 1024
/// (the handle and address learnt from A's genuine write at 0); returns
/// once B placed it or refused it.
fn forged_rdma_write(key: Option<&Path>) -> (Rig, Handled) {
    const FORGED: [u8; 256] = [0x66; 256];
    let mut r = setup(key);
    let (m, c) = (&mut r.m, &mut r.c);
    c.rdma_write(&[0x11; 512], 0);
    let last = m.last_sequenced(c.a.mac, c.b.mac);
    let write = sniffed_write(m, c.a.mac);
    let h = HeaderRepr {
        kind: Kind::RdmaWrite as u8,
        flags: last.flags & flags::RELIABLE | flags::FIRST | flags::LAST,
        msg_len: FORGED.len() as u32,
        rdma_addr: write.rdma_addr + 1024,
        rdma_handle: write.rdma_handle,
        ..next_in_stream(&last)
    };
    let before = c.b.counters();
    m.forge(&h, &FORGED);
    let mem = c.mem_b.clone();
    let after = c.b.wait_for("B placing or refusing M's write", |k| k.rx_bad_auth > before.rx_bad_auth || mem.to_vec(1024..1280).unwrap() == FORGED);
    assert_eq!(c.mem_b.to_vec(0..512).unwrap(), vec![0x11; 512], "A's genuine write");
    (r, Handled { before, after })
}

#[test]
fn unauthenticated_a_forged_rdma_write_lands_in_b_memory() {
    let (r, h) = forged_rdma_write(None);
    assert_eq!(r.c.mem_b.to_vec(1024..1280).unwrap(), vec![0x66; 256], "M's bytes in B's memory");
    assert_eq!(h.rose(|k| k.rx_bad_auth), 0);
    both_connected(&r.c);
    assert!(r.c.b.nic.take_async_errors().is_empty(), "neither side noticed");
}

#[test]
fn keyed_a_forged_rdma_write_is_refused_and_counted() {
    let secret = SecretFile::new("write");
    let (mut r, h) = forged_rdma_write(Some(secret.path()));
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1, "M's one frame reached B and was refused");
    assert_eq!(r.c.mem_b.to_vec(1024..1280).unwrap(), vec![0xBB; 256], "B's memory unchanged");
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn keyed_a_forged_rdma_write_without_any_tag_is_refused_and_counted() {
    let secret = SecretFile::new("write-crc");
    let mut r = setup(Some(secret.path()));
    r.m.key = None; // M sends the keyless format, CRC-32C and no tag
    r.c.rdma_write(&[0x11; 64], 0);
    let last = r.m.last_sequenced(r.c.a.mac, r.c.b.mac);
    let write = sniffed_write(&r.m, r.c.a.mac);
    let h = HeaderRepr { kind: Kind::RdmaWrite as u8, flags: last.flags & flags::RELIABLE | flags::FIRST | flags::LAST, msg_len: 64, rdma_addr: write.rdma_addr + 1024, rdma_handle: write.rdma_handle, ..next_in_stream(&last) };
    let before = r.c.b.counters();
    r.m.forge(&h, &[0x66; 64]);
    let after = r.c.b.wait_for("B refusing M's untagged write", |k| k.rx_bad_auth > before.rx_bad_auth);
    assert_eq!(after.rx_bad_auth, before.rx_bad_auth + 1);
    assert_eq!(r.c.mem_b.to_vec(1024..1088).unwrap(), vec![0xBB; 64], "B's memory unchanged");
    genuine_traffic_flows(&mut r.c);
}

/// B has receives posted at 0 and 4096 (and, without a key, 8192, where
/// A's next message would go); A sends one genuine
/// message into the first; M forges a send "from A" with the next PSN and
/// message number. Returns once B handled it (refused, or, without a key,
/// took it into the second receive: then `Handled` is B's counters before
/// and after that delivery).
fn forged_send(key: Option<&Path>, payload: &[u8]) -> (Rig, Handled) {
    let mut r = setup(key);
    let (m, c) = (&mut r.m, &mut r.c);
    for k in 0..if key.is_some() { 2 } else { 3 } {
        c.post_recv_b(k * 4096..(k + 1) * 4096);
    }
    c.send(b"genuine, from A");
    assert_eq!(c.recv_b(0..15), (15, b"genuine, from A".to_vec()));
    let last = m.last_sequenced(c.a.mac, c.b.mac);
    let h = HeaderRepr { kind: Kind::Data as u8, flags: last.flags & flags::RELIABLE | flags::FIRST | flags::LAST, msg_len: payload.len() as u32, ..next_in_stream(&last) };
    let before = c.b.counters();
    m.forge(&h, payload);
    let after = match key {
        Some(_) => c.b.wait_for("B refusing M's send", |k| k.rx_bad_auth > before.rx_bad_auth),
        None => c.b.counters(),
    };
    (r, Handled { before, after })
}

#[test]
fn unauthenticated_a_forged_send_is_delivered_as_from_a() {
    let (mut r, _) = forged_send(None, b"forged by M");
    let (len, got) = r.c.recv_b(4096..4096 + 11);
    assert_eq!((len, got.as_slice()), (11, &b"forged by M"[..]), "B took M's message for A's");
    both_connected(&r.c);
}

#[test]
fn keyed_a_forged_send_is_refused_and_counted() {
    let secret = SecretFile::new("send");
    let (mut r, h) = forged_send(Some(secret.path()), b"forged by M");
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1, "M's one frame reached B and was refused");
    assert!(r.c.vi_b.recv_done().unwrap().is_none(), "nothing delivered");
    assert_eq!(r.c.mem_b.to_vec(4096..8192).unwrap(), vec![0xBB; 4096], "B's posted receive untouched");
    r.c.send(b"A's next");
    assert_eq!(r.c.recv_b(4096..4104), (8, b"A's next".to_vec()), "the receive M aimed at takes A's message");
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn unauthenticated_a_forged_frame_steals_a_sequence_number() {
    let (mut r, _) = forged_send(None, b"M took this PSN");
    let c = &mut r.c;
    assert_eq!(c.recv_b(4096..4096 + 15).1, b"M took this PSN");
    let dup = c.b.counters().rx_duplicate;
    // A's real second message has the PSN M used: acknowledged, thrown away.
    c.send(b"second, from A");
    assert!(c.b.counters().rx_duplicate > dup, "A's frame was taken for a duplicate");
    assert!(c.vi_b.recv_done().unwrap().is_none(), "A's second message was never delivered");
    assert_eq!(c.mem_b.to_vec(8192..8192 + 14).unwrap(), vec![0xBB; 14]);
    both_connected(c);
}

#[test]
fn keyed_a_forged_frame_steals_no_sequence_number() {
    let secret = SecretFile::new("steal");
    let (mut r, h) = forged_send(Some(secret.path()), b"M took this PSN");
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1);
    let c = &mut r.c;
    // A's real second message has the PSN M tried: B takes it, intact.
    c.send(b"second, from A");
    assert_eq!(c.recv_b(4096..4096 + 14), (14, b"second, from A".to_vec()), "A's real message arrives intact");
    genuine_traffic_flows(c);
}

// ---- RDMA read requests replayed ----

/// Bytes A reads, and so B's response to one request.
const READ: usize = 8192;

/// M sends `frame` (a read request) `times` times, each after B handled
/// the one before (served again or dropped as a replayed or stale read
/// request, or refused for its tag; so none is merged with a response
/// still going out). Counted by those counters, not by duplicates: a
/// genuine duplicate from A (a retransmission on a loaded machine) must
/// not stand for a replay. Returns B's response frames meanwhile and B's
/// counters around.
fn replay(m: &Attacker, c: &Connected, frame: &[u8], times: u64) -> (u64, Handled) {
    let before = c.b.counters();
    let served = |k: &Counters| k.read_requests_replayed + k.read_requests_stale + k.rx_bad_auth;
    let handled = |k: &Counters| served(k) - served(&before);
    for i in 1..=times {
        m.send_raw(frame);
        c.b.wait_for("B handling a replayed read request", |k| handled(k) >= i);
    }
    let after = c.b.counters();
    ((after.tx_frames - before.tx_frames) - (after.acks_sent - before.acks_sent), Handled { before, after })
}

/// A reads once; M replays A's request 100 times as it saw it (with a
/// key: its genuine tag). Returns (B's response frames to the replays,
/// B's frames for one genuine read, B's counters around the replays).
fn replayed_read_requests(key: Option<&Path>) -> (Rig, u64, u64, Handled) {
    let mut r = setup(key);
    let genuine = r.c.b.counters();
    r.c.rdma_read(0, READ);
    let req = sniffed_read_request(&mut r.m, r.c.a.mac);
    let now = r.c.b.counters();
    let per_read = (now.tx_frames - genuine.tx_frames) - (now.acks_sent - genuine.acks_sent);
    assert!(per_read >= READ.div_ceil(1500) as u64, "{per_read} response frames for a read of {READ} bytes");
    let (responses, h) = replay(&r.m, &r.c, &req, 100);
    (r, responses, per_read, h)
}

fn check_replays_bounded(key: Option<&Path>) {
    let (mut r, responses, per_read, h) = replayed_read_requests(key);
    let retries = via_user::Config::default().retry_limit as u64;
    let (replayed, stale) = (h.rose(|k| k.read_requests_replayed), h.rose(|k| k.read_requests_stale));
    assert_eq!(replayed + stale, 100, "every replay counted");
    assert!(replayed <= retries, "served again {replayed} times: more than a requester may ask ({retries})");
    assert!(responses <= retries * per_read, "100 replayed requests made B send {responses} response frames (one read is {per_read})");
    assert_eq!(h.rose(|k| k.rx_bad_auth), 0, "a replay carries a genuine tag");
    if key.is_some() {
        genuine_traffic_flows(&mut r.c);
    }
    assert_eq!(r.c.b.phase(r.c.vi_b.id()), ViPhase::Connected);
}

#[test]
fn replayed_read_requests_are_not_served_again_and_again() {
    check_replays_bounded(None);
}

#[test]
fn keyed_replayed_read_requests_are_not_served_again_and_again() {
    let secret = SecretFile::new("replay");
    check_replays_bounded(Some(secret.path()));
}

#[test]
fn keyed_read_requests_forged_by_m_get_no_response() {
    let secret = SecretFile::new("forged-reads");
    let mut r = setup(Some(secret.path()));
    r.c.rdma_read(0, READ);
    let req = header_of(&sniffed_read_request(&mut r.m, r.c.a.mac));
    // A request M made itself (its own tag): the next PSN, the same read.
    let mine = via_tests::attack::attacker::forged_tagged(&HeaderRepr { psn: req.psn.wrapping_add(1), msg_seq: req.msg_seq.wrapping_add(1), ..req }, &[], r.m.key.as_ref().unwrap());
    let (responses, h) = replay(&r.m, &r.c, &mine, 100);
    assert_eq!(h.rose(|k| k.rx_bad_auth), 100, "each of M's requests reached B and was refused");
    assert_eq!(responses, 0, "B answered M");
    assert_eq!(h.rose(|k| k.read_requests_replayed) + h.rose(|k| k.read_requests_stale), 0);
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn read_requests_older_than_the_reads_remembered_are_never_served_again() {
    let mut r = setup(None);
    r.c.rdma_read(0, READ);
    let req = sniffed_read_request(&mut r.m, r.c.a.mac);
    // A reads on: as many reads as it could have outstanding, and more.
    let reads = via_user::Config::default().queue_depth + 8;
    r.c.rdma_reads(16384, 64, reads);
    let (responses, h) = replay(&r.m, &r.c, &req, 100);
    assert_eq!(h.rose(|k| k.read_requests_replayed), 0, "an old read served again");
    assert_eq!(h.rose(|k| k.read_requests_stale), 100);
    assert_eq!(responses, 0, "B sent response frames for requests it should have dropped");
    assert_eq!(r.c.b.phase(r.c.vi_b.id()), ViPhase::Connected);
}

/// M sends a duplicate of A's read request spoiled by `spoil` (a probe of
/// B's memory protection); returns once B handled it.
fn probe(key: Option<&Path>, spoil: impl FnOnce(&mut HeaderRepr)) -> (Rig, Handled) {
    let mut r = setup(key);
    r.c.rdma_read(0, READ);
    let mut req = header_of(&sniffed_read_request(&mut r.m, r.c.a.mac));
    spoil(&mut req);
    let before = r.c.b.counters();
    r.m.forge(&req, &[]);
    let after = r.c.b.wait_for("B handling the probe", |k| k.rx_duplicate > before.rx_duplicate || k.rx_bad_auth > before.rx_bad_auth);
    (r, Handled { before, after })
}

/// Without a key, a probe costs the connection as any violation.
fn check_probe_breaks(spoil: impl FnOnce(&mut HeaderRepr)) {
    let (r, h) = probe(None, spoil);
    let c = &r.c;
    assert_eq!(h.rose(|k| k.rdma_prot_errors), 1, "the probe is a protection violation");
    assert_eq!(c.b.phase(c.vi_b.id()), ViPhase::Error, "the probe breaks the connection");
    assert!(c.b.nic.take_async_errors().iter().any(|e| e.kind == AsyncErrorKind::RdmaReadProt));
    c.a.wait_for("A learning its connection is gone", |k| k.connections_lost >= 1);
    assert_eq!(c.a.phase(c.vi_a.id()), ViPhase::Error);
}

/// With a key, M's probe fails its tag: no violation, nothing broken.
fn check_probe_refused(name: &str, spoil: impl FnOnce(&mut HeaderRepr)) {
    let secret = SecretFile::new(name);
    let (mut r, h) = probe(Some(secret.path()), spoil);
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1, "M's probe reached B and was refused");
    assert_eq!(h.rose(|k| k.rdma_prot_errors), 0, "no violation: the probe was never looked at");
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn a_duplicate_read_request_with_a_wrong_handle_breaks_the_connection() {
    check_probe_breaks(|h| h.rdma_handle ^= 0x0100);
}

#[test]
fn a_duplicate_read_request_out_of_bounds_breaks_the_connection() {
    check_probe_breaks(|h| h.rdma_addr += via_tests::attack::MEM as u64);
}

#[test]
fn keyed_a_read_request_with_a_wrong_handle_is_refused_and_counted() {
    check_probe_refused("probe-handle", |h| h.rdma_handle ^= 0x0100);
}

#[test]
fn keyed_a_read_request_out_of_bounds_is_refused_and_counted() {
    check_probe_refused("probe-bounds", |h| h.rdma_addr += via_tests::attack::MEM as u64);
}

// ---- connection management ----

/// What A made of M's answer to its connection request.
struct Answered {
    /// A's counters before M's answer and once A handled it.
    heard: Handled,
    /// A's VI phase then.
    phase: ViPhase,
    /// A's connect result after B accepts.
    connected: via_user::Result<()>,
}

/// A asks B to connect; B has a ConnectWait (and answers pending) but
/// waits for the test to accept. M answers A's request first with a
/// forged `kind` from its own MAC. A and B share `key`, if any.
fn forged_answer(kind: Kind, key: Option<&Path>) -> Answered {
    let seg = Segment::new();
    let mut m = Attacker::open(&seg);
    m.key = key.map(|_| stranger_key());
    let opts = HostOptions { key };
    let (a, b) = (Host::open(&seg, Station::A, opts), Host::open(&seg, Station::B, opts));
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
        let after = a.wait_for("A handling M's answer", |k| k.rx_cm_foreign > before.rx_cm_foreign || k.rx_bad_auth > before.rx_bad_auth || a.phase(id_a) != ViPhase::ConnectPending);
        let phase = a.phase(id_a);
        go.send(()).unwrap();
        let (connected, _vi_a) = a_thread.join().unwrap();
        b_thread.join().unwrap();
        Answered { heard: Handled { before, after }, phase, connected }
    })
}

#[test]
fn a_connect_accept_from_a_host_not_asked_is_ignored() {
    let r = forged_answer(Kind::ConnAccept, None);
    assert_eq!(r.phase, ViPhase::ConnectPending, "A did not connect to M");
    assert_eq!(r.heard.rose(|k| k.rx_cm_foreign), 1, "M's accept counted as foreign");
    r.connected.expect("A connects to B, the host it asked");
}

#[test]
fn a_connect_reject_from_a_host_not_asked_is_ignored() {
    let r = forged_answer(Kind::ConnReject, None);
    assert_eq!(r.phase, ViPhase::ConnectPending, "A's request goes on");
    assert_eq!(r.heard.rose(|k| k.rx_cm_foreign), 1, "M's reject counted as foreign");
    r.connected.expect("A connects to B, the host it asked");
}

fn check_keyed_answer_refused(kind: Kind, name: &str) {
    let secret = SecretFile::new(name);
    let r = forged_answer(kind, Some(secret.path()));
    assert_eq!(r.phase, ViPhase::ConnectPending, "A's request goes on");
    assert_eq!(r.heard.rose(|k| k.rx_bad_auth), 1, "M's answer reached A and was refused");
    assert_eq!(r.heard.rose(|k| k.rx_cm_foreign), 0, "refused before it was looked at");
    r.connected.expect("A connects to B, the host it asked");
}

#[test]
fn keyed_a_forged_connect_accept_is_refused_and_counted() {
    check_keyed_answer_refused(Kind::ConnAccept, "accept");
}

#[test]
fn keyed_a_forged_connect_reject_is_refused_and_counted() {
    check_keyed_answer_refused(Kind::ConnReject, "reject");
}

/// M sends B a Disconnect "from A" (A's endpoint, VI and generation, as
/// seen), addressed to endpoint `dst_ep` (`None`: B's own); returns once
/// B handled it.
fn forged_disconnect(key: Option<&Path>, dst_ep: Option<u32>) -> (Rig, Handled) {
    let mut r = setup(key);
    r.c.rdma_write(&[0x11; 64], 0);
    let last = r.m.last_sequenced(r.c.a.mac, r.c.b.mac);
    let h = HeaderRepr { kind: Kind::Disconnect as u8, dst_ep: dst_ep.unwrap_or(last.dst_ep), ..next_in_stream(&last) };
    let before = r.c.b.counters();
    r.m.forge(&h, &[]);
    let after = r.c.b.wait_for("B handling the Disconnect", |k| k.rx_not_for_us > before.rx_not_for_us || k.connections_lost > before.connections_lost || k.rx_bad_auth > before.rx_bad_auth);
    (r, Handled { before, after })
}

#[test]
fn a_disconnect_to_endpoint_zero_is_not_for_anyone() {
    let (mut r, h) = forged_disconnect(None, Some(ANY_ENDPOINT));
    assert_eq!(h.rose(|k| k.connections_lost), 0, "the forged Disconnect broke B's connection");
    assert_eq!(h.rose(|k| k.rx_not_for_us), 1);
    assert_eq!(r.c.b.phase(r.c.vi_b.id()), ViPhase::Connected);
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn unauthenticated_a_forged_disconnect_to_b_endpoint_breaks_the_connection() {
    let (r, h) = forged_disconnect(None, None);
    assert_eq!(h.rose(|k| k.connections_lost), 1, "B took M's Disconnect for A's");
    assert_eq!(r.c.b.phase(r.c.vi_b.id()), ViPhase::Error);
}

fn check_keyed_disconnect_refused(name: &str, dst_ep: Option<u32>) {
    let secret = SecretFile::new(name);
    let (mut r, h) = forged_disconnect(Some(secret.path()), dst_ep);
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1, "M's Disconnect reached B and was refused");
    assert_eq!((h.rose(|k| k.connections_lost), h.rose(|k| k.rx_not_for_us)), (0, 0), "refused before it was looked at");
    genuine_traffic_flows(&mut r.c);
}

#[test]
fn keyed_a_forged_disconnect_to_endpoint_zero_is_refused_and_counted() {
    check_keyed_disconnect_refused("disconnect-0", Some(ANY_ENDPOINT));
}

#[test]
fn keyed_a_forged_disconnect_to_b_endpoint_is_refused_and_counted() {
    check_keyed_disconnect_refused("disconnect-b", None);
}

/// B alone on the segment (sharing `key` with nobody), M asking it, by
/// broadcast, for the name of whoever has the empty one; returns once B
/// handled the query, and M's socket.
fn empty_name_query(key: Option<&Path>) -> (Segment, Attacker, Host, Handled) {
    let seg = Segment::new();
    let mut m = Attacker::open(&seg);
    m.key = key.map(|_| stranger_key());
    let b = Host::open(&seg, Station::B, HostOptions { key });
    let before = b.counters();
    m.forge_cm(&name_query(&m, MacAddr::BROADCAST), &ConnRepr { request_id: 0x4d, ..ConnRepr::default() });
    let after = b.wait_for("B handling the broadcast query", |k| k.rx_frames > before.rx_frames);
    (seg, m, b, Handled { before, after })
}

fn name_query(m: &Attacker, dst: MacAddr) -> HeaderRepr {
    HeaderRepr { dst_mac: dst, src_mac: m.mac, kind: Kind::NameQuery as u8, dst_ep: ANY_ENDPOINT, src_ep: 0x4d4d, ..HeaderRepr::default() }
}

#[test]
fn an_empty_name_broadcast_query_gets_no_answer() {
    let (_seg, mut m, b, h) = empty_name_query(None);
    assert_eq!(h.rose(|k| k.rx_query_refused), 1, "refused and counted");
    assert_eq!(h.rose(|k| k.tx_frames), 0, "B answered everybody with its name");
    // Sent to B alone, the same question is answered (VipNSGetHostByAddr).
    m.forge_cm(&name_query(&m, b.mac), &ConnRepr { request_id: 0x4d, ..ConnRepr::default() });
    let reply = m.sniff(STEP, "B's name reply", |f| f.kind() == Some(Kind::NameReply) && f.src_mac() == b.mac);
    let f = Frame::new_checked(&reply[..]).unwrap();
    assert!(!ConnRepr::parse(f.payload()).unwrap().discriminator.is_empty(), "B says its name");
}

#[test]
fn keyed_an_empty_name_broadcast_query_is_refused_and_counted() {
    let secret = SecretFile::new("query");
    let (_seg, m, b, h) = empty_name_query(Some(secret.path()));
    assert_eq!(h.rose(|k| k.rx_bad_auth), 1, "M's query reached B and was refused");
    assert_eq!((h.rose(|k| k.rx_query_refused), h.rose(|k| k.tx_frames)), (0, 0), "refused before it was looked at; no answer");
    // Sent to B alone: refused as well, and still no answer.
    m.forge_cm(&name_query(&m, b.mac), &ConnRepr { request_id: 0x4d, ..ConnRepr::default() });
    let after = b.wait_for("B handling the directed query", |k| k.rx_bad_auth > h.after.rx_bad_auth);
    assert_eq!((after.rx_bad_auth, after.tx_frames), (h.after.rx_bad_auth + 1, h.after.tx_frames), "B tells M nothing");
}
