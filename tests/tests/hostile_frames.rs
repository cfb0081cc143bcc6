//! Hostile frames against a live VI (issue 8): a raw device on the
//! loopback wire injects crafted frames at a VI connected to a genuine
//! peer, on the rig of `via_tests::rig` (one thread, a clock moved by
//! hand). Frames that are not the peer's (another host, endpoint, VI or
//! generation) or not well formed are dropped and counted, and have no
//! effect at all: the genuine messages around them each arrive once, in
//! order, intact, in the receive posted for them; no receive holds a
//! hostile byte; the receive nothing was sent for stays untouched; both
//! VIs stay connected with no error reported. Frames that are the peer's
//! in every respect but say inconsistent things are counted and break a
//! reliable connection, reported as such to the victim and to its peer
//! (or cost an unreliable VI that message), without a hostile byte in any
//! receive or anywhere else.

use via_wire::{self as wire, flags, HeaderRepr, Kind, ANY_ENDPOINT, ETH_HEADER_LEN, FRAME_HEADER_LEN};
use via_wire::MacAddr;
use via_tests::rig::arena::{page, pages, PAGE};
use via_tests::rig::{frame_bytes, Host, Rig};
use via_user::descriptor::status;
use via_user::engine::post::Queue;
use via_user::engine::UNRELIABLE_VIOLATION_LIMIT;
use via_user::{AsyncErrorKind, Reliability, ViPhase};

const LEVELS: [Reliability; 3] = [Reliability::Unreliable, Reliability::ReliableDelivery, Reliability::ReliableReception];
/// Bytes per posted receive (two segments) and per genuine message (two fragments).
const RECV: usize = 2000;
const MSG: usize = 1800;

fn message(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(37) ^ seed).collect()
}

/// Posts receives in slots `slots` of the victim, each `RECV` bytes of
/// the buffer pages split over two segments.
fn post_receives(a: &mut Host, slots: std::ops::Range<usize>) {
    for k in slots {
        let at = (k % 4) * RECV;
        a.post_recv(k, &[at..at + 700, at + 700..at + RECV]);
    }
}

/// Sends genuine message `k` from the peer (slot and buffer `k % 4`).
fn send_genuine(rig: &mut Rig, k: usize) {
    rig.b.post_send(k % 4, (k % 4) * RECV, &message(k as u8, MSG), None);
    rig.b.engine.ring_doorbell();
}

/// Steps until the victim completes a receive; returns (slot, status, length).
fn next_receive(rig: &mut Rig) -> (usize, u32, u32) {
    let mut got = None;
    let done = rig.step_until(5000, |r| {
        got = r.a.done(Queue::Recv);
        got.is_some()
    });
    assert!(done, "no receive completed");
    let slot = got.unwrap();
    let (st, len, _) = rig.a.completion(slot);
    (slot, st, len)
}

/// Arena range of the buffer of the receive posted in slot `slot`.
fn recv_buffer(slot: usize) -> std::ops::Range<usize> {
    let at = page::BUFS * PAGE + (slot % 4) * RECV;
    at..at + RECV
}

/// Genuine message `k` is in the receive of slot `want_slot` (`got`
/// says which completed), complete and intact, and the rest of that
/// receive's buffer holds what it held: no byte of anything else.
fn assert_intact(rig: &Rig, k: usize, want_slot: usize, (slot, st, len): (usize, u32, u32)) {
    assert_eq!(slot, want_slot, "message {k} completed the receive of slot {slot}, not the one posted for it");
    assert_eq!(st & status::ERROR_MASK, 0, "message {k}: status {st:#x}");
    assert_eq!(len as usize, MSG, "message {k}");
    let at = (slot % 4) * RECV;
    assert_eq!(rig.a.buf(at..at + MSG), message(k as u8, MSG), "message {k} arrived corrupted");
    let rest = recv_buffer(slot).start + MSG..recv_buffer(slot).end;
    assert_eq!(rig.a.arena.read(rest.clone()), rig.a.original(rest), "message {k}: bytes past it in its receive changed");
}

/// The receive of slot `slot` holds what it held before it was posted.
fn assert_untouched(rig: &Rig, slot: usize, who: &str) {
    let r = recv_buffer(slot);
    assert_eq!(rig.a.arena.read(r.clone()), rig.a.original(r), "{who}: the buffer of receive {slot} changed");
}

/// After a while, nothing more completes on the victim's receive queue;
/// the peer's `sends` sends (slots `0..sends`) all completed, in order,
/// without error; both VIs are connected and neither reported an error.
fn assert_quiet_and_connected(rig: &mut Rig, sends: usize, who: &str) {
    for _ in 0..200 {
        rig.step();
    }
    assert_eq!(rig.a.done(Queue::Recv), None, "{who}: a receive completed with no genuine message for it");
    for k in 0..sends {
        let slot = rig.b.done(Queue::Send);
        assert_eq!(slot, Some(k % 4), "{who}: the peer's send {k}");
        let (st, _, _) = rig.b.completion(k % 4);
        assert_eq!(st & status::ERROR_MASK, 0, "{who}: the peer's send {k} completed {st:#x}");
    }
    for h in [&rig.a, &rig.b] {
        let core = &h.engine.core;
        assert_eq!(core.vi(h.vi).unwrap().phase, ViPhase::Connected, "{who}");
        assert!(core.async_errors.is_empty(), "{who}: {:?}", core.async_errors);
        assert_eq!(core.counters.connections_lost, 0, "{who}");
    }
}

/// A case of frames that are not the peer's: builds one frame per call.
struct Foreign {
    name: &'static str,
    frame: fn(&Rig, u16) -> Vec<u8>,
    /// The counter that must rise by one per frame.
    counter: fn(&Host) -> u64,
}

fn spoil(rig: &Rig, len: usize, f: impl FnOnce(&mut HeaderRepr)) -> Vec<u8> {
    let mut h = rig.genuine(len);
    f(&mut h);
    frame_bytes(&h, &message(0xEE, len))
}

fn device(h: &Host, name: &str) -> u64 {
    h.engine.device_stats().into_iter().find(|s| s.0 == name).map_or(0, |s| s.1)
}

fn foreign_cases() -> Vec<Foreign> {
    vec![
        Foreign { name: "unknown source host", frame: |r, _| spoil(r, 64, |h| h.src_mac = MacAddr([2, 0xee, 0, 0, 0, 9])), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "unknown source endpoint", frame: |r, _| spoil(r, 64, |h| h.src_ep ^= 0x10), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "another source VI", frame: |r, _| spoil(r, 64, |h| h.src_vi += 1), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "stale generation", frame: |r, _| spoil(r, 64, |h| h.generation = h.generation.wrapping_sub(1)), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "VI that does not exist", frame: |r, _| spoil(r, 64, |h| h.dst_vi = 900), counter: |h| h.engine.core.counters.rx_no_vi },
        Foreign { name: "VI zero", frame: |r, _| spoil(r, 64, |h| h.dst_vi = 0), counter: |h| h.engine.core.counters.rx_no_vi },
        Foreign { name: "VI not connected", frame: |r, idle| spoil(r, 64, |h| h.dst_vi = idle), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "data to any endpoint", frame: |r, _| spoil(r, 64, |h| (h.dst_ep, h.dst_mac) = (ANY_ENDPOINT, MacAddr::BROADCAST)), counter: |h| h.engine.core.counters.rx_not_for_us },
        Foreign { name: "another endpoint (the device's filter)", frame: |r, _| spoil(r, 64, |h| h.dst_ep ^= 1), counter: |h| device(h, "rx_filtered") },
        Foreign { name: "disconnect of a stale generation", frame: |r, _| spoil(r, 0, |h| (h.kind, h.generation) = (Kind::Disconnect as u8, h.generation ^ 1)), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "disconnect from another host", frame: |r, _| spoil(r, 0, |h| (h.kind, h.src_mac) = (Kind::Disconnect as u8, MacAddr([2, 0xee, 0, 0, 0, 9]))), counter: |h| h.engine.core.counters.rx_stale },
        Foreign { name: "disconnect of a VI that does not exist", frame: |r, _| spoil(r, 0, |h| (h.kind, h.dst_vi) = (Kind::Disconnect as u8, 900)), counter: |h| h.engine.core.counters.rx_no_vi },
        Foreign { name: "header cut short", frame: |r, _| spoil(r, 64, |_| ())[..40].to_vec(), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign { name: "header one byte short", frame: |r, _| spoil(r, 0, |_| ())[..FRAME_HEADER_LEN - 1].to_vec(), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign { name: "payload_len beyond the frame", frame: |r, _| spoil(r, 64, |h| h.payload_len = 65)[..FRAME_HEADER_LEN + 64].to_vec(), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign {
            name: "oversized: bytes past the payload",
            frame: |r, _| {
                let mut f = spoil(r, 64, |_| ());
                f.resize(9000, 0xEE);
                f
            },
            counter: |h| h.engine.core.counters.rx_malformed,
        },
        Foreign { name: "unknown version", frame: |r, _| with_byte(spoil(r, 64, |_| ()), ETH_HEADER_LEN, 2), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign { name: "unknown kind", frame: |r, _| spoil(r, 64, |h| h.kind = 99), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign { name: "kind 0", frame: |r, _| spoil(r, 64, |h| h.kind = 0), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign { name: "not VIA (the device's filter)", frame: |r, _| with_byte(spoil(r, 64, |_| ()), 12, 0x08), counter: |h| device(h, "rx_filtered") },
        Foreign { name: "connection frame with a cut payload", frame: |r, _| spoil(r, 3, |h| h.kind = Kind::ConnAccept as u8), counter: |h| h.engine.core.counters.rx_malformed },
        Foreign {
            name: "wrong checksum",
            frame: |r, _| {
                let mut f = spoil(r, 64, |_| ());
                let (head, payload) = f.split_at_mut(FRAME_HEADER_LEN);
                wire::seal(head, [&*payload]);
                payload[5] ^= 1;
                f
            },
            counter: |h| h.engine.core.counters.rx_bad_checksum,
        },
    ]
}

fn with_byte(mut f: Vec<u8>, at: usize, v: u8) -> Vec<u8> {
    f[at] = v;
    f
}

/// Injects `frame` three times around three genuine messages and checks
/// the counter, the messages, the fourth receive (nothing was sent for
/// it), the connection, the RDMA window and the rest of the memory.
fn survive(level: Reliability, case: &Foreign) {
    let mut rig = Rig::new(level);
    let attrs = rig.a.engine.core.vi(rig.a.vi).unwrap().attrs;
    let idle = rig.a.engine.core.create_vi(attrs, None, None).unwrap();
    post_receives(&mut rig.a, 0..4);
    let before = rig.a.arena.snapshot();
    let count0 = (case.counter)(&rig.a);
    let lost0 = rig.a.engine.core.counters.connections_lost;
    for k in 0..3 {
        let f = (case.frame)(&rig, idle);
        assert!(rig.inject(&f), "{}: the wire refused the frame", case.name);
        send_genuine(&mut rig, k);
        let got = next_receive(&mut rig);
        assert_intact(&rig, k, k, got);
    }
    assert_eq!((case.counter)(&rig.a) - count0, 3, "{} ({level:?}): counted once per frame", case.name);
    let who = format!("{} ({level:?})", case.name);
    assert_quiet_and_connected(&mut rig, 3, &who);
    assert_untouched(&rig, 3, &who);
    let vi = rig.a.engine.core.vi(rig.a.vi).unwrap();
    assert_eq!(vi.phase, ViPhase::Connected, "{} ({level:?})", case.name);
    assert_eq!(rig.a.engine.core.counters.connections_lost, lost0);
    assert!(rig.a.engine.core.async_errors.is_empty(), "{}: {:?}", case.name, rig.a.engine.core.async_errors);
    assert_eq!(rig.a.changed_outside(&[]), None, "{} ({level:?}): memory changed", case.name);
    assert_eq!(rig.a.arena.snapshot()[pages(page::WINDOW, 2)], before[pages(page::WINDOW, 2)], "{}: the RDMA window changed", case.name);
}

#[test]
fn frames_that_are_not_the_peers_are_dropped_and_counted() {
    for level in LEVELS {
        for case in foreign_cases() {
            survive(level, &case);
        }
    }
}

#[test]
fn out_of_window_sequence_numbers_are_dropped_and_counted() {
    for level in [Reliability::ReliableDelivery, Reliability::ReliableReception] {
        let cases: [Foreign; 2] = [
            Foreign { name: "sequence number ahead", frame: |r, _| spoil(r, 64, |h| h.psn = h.psn.wrapping_add(1000)), counter: |h| h.engine.core.counters.rx_out_of_order },
            Foreign { name: "sequence number behind", frame: |r, _| spoil(r, 64, |h| h.psn = h.psn.wrapping_sub(1000)), counter: |h| h.engine.core.counters.rx_duplicate },
        ];
        for case in &cases {
            survive(level, case);
        }
    }
}

/// What a frame that is the peer's in every respect does to the VI.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    /// The reliable connection breaks; an unreliable VI drops the message.
    Breaks,
    /// The receive it took completes with LENGTH_ERROR; the VI goes on.
    LengthError,
}

struct Inconsistent {
    name: &'static str,
    header: fn(&mut HeaderRepr, &Host),
    payload: usize,
    counter: fn(&Host) -> u64,
    outcome: Outcome,
    /// The error the victim reports, if not a lost connection.
    reported_as: Option<AsyncErrorKind>,
}

fn inconsistent_cases() -> Vec<Inconsistent> {
    let bad_offset = |h: &Host| h.engine.core.counters.rx_bad_offset;
    let prot = |h: &Host| h.engine.core.counters.rdma_prot_errors;
    vec![
        Inconsistent { name: "payload past msg_len", header: |h, _| h.msg_len = 10, payload: 20, counter: bad_offset, outcome: Outcome::Breaks, reported_as: None },
        Inconsistent { name: "first fragment at an offset", header: |h, _| h.offset = 8, payload: 20, counter: bad_offset, outcome: Outcome::Breaks, reported_as: None },
        Inconsistent { name: "whole message without LAST", header: |h, _| h.flags &= !flags::LAST, payload: 20, counter: bad_offset, outcome: Outcome::Breaks, reported_as: None },
        Inconsistent { name: "LAST before the end", header: |h, _| h.msg_len = 500, payload: 20, counter: bad_offset, outcome: Outcome::Breaks, reported_as: None },
        Inconsistent { name: "msg_len beyond the receive buffer", header: |h, _| h.msg_len = 2500, payload: 2500, counter: |h| h.engine.core.counters.length_errors, outcome: Outcome::LengthError, reported_as: None },
        Inconsistent {
            name: "oversized fragment beyond the receive buffer",
            header: |h, _| h.msg_len = 9000,
            payload: 9000,
            counter: |h| h.engine.core.counters.length_errors,
            outcome: Outcome::LengthError,
            reported_as: None,
        },
        Inconsistent {
            name: "RDMA write running past the window",
            header: |h, a| (h.kind, h.rdma_handle, h.rdma_addr) = (Kind::RdmaWrite as u8, a.handles.window, a.addr(pages(page::WINDOW, 2).end) - 10),
            payload: 20,
            counter: prot,
            outcome: Outcome::Breaks,
            reported_as: Some(AsyncErrorKind::RdmaWriteProt),
        },
        Inconsistent {
            name: "RDMA write to memory with RDMA off",
            header: |h, a| (h.kind, h.rdma_handle, h.rdma_addr) = (Kind::RdmaWrite as u8, a.handles.closed, a.addr(page::CLOSED * PAGE)),
            payload: 20,
            counter: prot,
            outcome: Outcome::Breaks,
            reported_as: Some(AsyncErrorKind::RdmaWriteProt),
        },
        Inconsistent {
            name: "RDMA write under another protection tag",
            header: |h, a| (h.kind, h.rdma_handle, h.rdma_addr) = (Kind::RdmaWrite as u8, a.handles.foreign, a.addr(page::FOREIGN * PAGE)),
            payload: 20,
            counter: prot,
            outcome: Outcome::Breaks,
            reported_as: Some(AsyncErrorKind::RdmaWriteProt),
        },
        Inconsistent {
            name: "RDMA write with the window's handle at a guard page",
            header: |h, a| (h.kind, h.rdma_handle, h.rdma_addr) = (Kind::RdmaWrite as u8, a.handles.window, a.addr(page::GUARD_HI * PAGE)),
            payload: 20,
            counter: prot,
            outcome: Outcome::Breaks,
            reported_as: Some(AsyncErrorKind::RdmaWriteProt),
        },
    ]
}

/// Injects one frame that is the peer's but for `case`, then two genuine
/// messages; checks the counter, the outcome, what is reported, the
/// receives and the memory.
fn inconsistent(level: Reliability, case: &Inconsistent) {
    let mut rig = Rig::new(level);
    post_receives(&mut rig.a, 0..4);
    let before = rig.a.arena.snapshot();
    let count0 = (case.counter)(&rig.a);
    let mut h = rig.genuine(case.payload);
    (case.header)(&mut h, &rig.a);
    assert!(rig.inject(&frame_bytes(&h, &message(0xEE, case.payload))));
    rig.step();
    let who = format!("{} ({level:?})", case.name);
    assert_eq!((case.counter)(&rig.a) - count0, 1, "{who}: counted");
    assert_eq!(rig.a.changed_outside(&[]), None, "{who}: memory changed outside what the peer may write");
    assert_eq!(rig.a.arena.snapshot()[pages(page::WINDOW, 2)], before[pages(page::WINDOW, 2)], "{who}: the RDMA window changed");
    for slot in 0..4 {
        assert_untouched(&rig, slot, &who);
    }
    let phase = rig.a.engine.core.vi(rig.a.vi).unwrap().phase;
    let errors = |h: &Host| h.engine.core.async_errors.iter().map(|e| e.kind).collect::<Vec<_>>();
    // What the victim reports: a broken reliable connection as what broke
    // it; an unreliable VI the protection errors it drops.
    let reported: Vec<AsyncErrorKind> = match (case.outcome, level.is_reliable()) {
        (Outcome::Breaks, true) => vec![case.reported_as.unwrap_or(AsyncErrorKind::ConnLost)],
        (Outcome::Breaks, false) => case.reported_as.into_iter().collect(),
        (Outcome::LengthError, _) => vec![],
    };
    assert_eq!(errors(&rig.a), reported, "{who}: reported");
    let mut next_slot = 0;
    match case.outcome {
        Outcome::Breaks if level.is_reliable() => {
            assert_eq!(phase, ViPhase::Error, "{who}");
            for want in 0..4 {
                let (slot, st, len) = next_receive(&mut rig);
                assert!(slot == want && st & status::DESC_FLUSHED_ERROR != 0 && len == 0, "{who}: receive {slot} completed {st:#x}");
            }
            // The peer is told that the connection is gone.
            let told = rig.step_until(5000, |r| r.b.engine.core.vi(r.b.vi).unwrap().phase == ViPhase::Error);
            assert!(told, "{who}: the peer was not told that the connection broke");
            assert_eq!(errors(&rig.b), vec![AsyncErrorKind::ConnLost], "{who}: the peer");
            for slot in 0..4 {
                assert_untouched(&rig, slot, &who);
            }
            return;
        }
        Outcome::LengthError => {
            let (slot, st, len) = next_receive(&mut rig);
            assert_eq!((slot, st & status::ERROR_MASK, len), (0, status::LENGTH_ERROR, 0), "{who}");
            next_slot = 1;
        }
        Outcome::Breaks => {
            // Unreliable: a message the frame began completes with an error.
            if let Some(slot) = rig.a.done(Queue::Recv) {
                let (st, _, _) = rig.a.completion(slot);
                assert!(slot == 0 && st & status::PARTIAL_ERROR != 0, "{who}: {st:#x}");
                next_slot = 1;
            }
        }
    }
    assert_eq!(phase, ViPhase::Connected, "{who}");
    // The genuine traffic goes on. A reliable VI took the frame's sequence
    // number from the peer, so the peer's next message is a duplicate to
    // it (the spoofer made it lose one message); the one after arrives.
    send_genuine(&mut rig, 1);
    if !level.is_reliable() {
        let got = next_receive(&mut rig);
        assert_intact(&rig, 1, next_slot, got);
        next_slot += 1;
    }
    send_genuine(&mut rig, 2);
    let got = next_receive(&mut rig);
    assert_intact(&rig, 2, next_slot, got);
    for slot in next_slot + 1..4 {
        assert_untouched(&rig, slot, &who);
    }
    for _ in 0..200 {
        rig.step();
    }
    assert_eq!(rig.a.done(Queue::Recv), None, "{who}: a receive completed with no genuine message for it");
    for h in [&rig.a, &rig.b] {
        assert_eq!(h.engine.core.vi(h.vi).unwrap().phase, ViPhase::Connected, "{who}");
    }
    assert_eq!(errors(&rig.a), reported, "{who}: reported");
    assert_eq!(errors(&rig.b), vec![], "{who}: the peer");
    assert_eq!(rig.a.engine.core.counters.connections_lost + rig.b.engine.core.counters.connections_lost, 0, "{who}");
    // The peer's sends complete; on Reliable Reception, the one the
    // victim took for the frame's message is told of its failure.
    for k in [1, 2] {
        assert_eq!(rig.b.done(Queue::Send), Some(k), "{who}: the peer's send {k}");
        let (st, _, _) = rig.b.completion(k);
        let told = case.outcome == Outcome::LengthError && level == Reliability::ReliableReception && k == 1;
        let want = if told { status::REMOTE_DESC_ERROR } else { 0 };
        assert_eq!(st & status::ERROR_MASK, want, "{who}: the peer's send {k} completed {st:#x}");
    }
}

#[test]
fn inconsistent_frames_from_the_peer_are_counted_and_corrupt_nothing() {
    for level in LEVELS {
        for case in inconsistent_cases() {
            inconsistent(level, &case);
        }
    }
}

#[test]
fn reliable_middle_fragment_without_a_message_is_counted() {
    for level in [Reliability::ReliableDelivery, Reliability::ReliableReception] {
        let mut rig = Rig::new(level);
        post_receives(&mut rig.a, 0..2);
        let before = rig.a.arena.snapshot();
        let mut h = rig.genuine(564);
        (h.flags, h.offset, h.msg_len) = (h.flags & !flags::FIRST, 1436, 2000);
        assert!(rig.inject(&frame_bytes(&h, &message(0xEE, 564))));
        rig.step();
        assert_eq!(rig.a.engine.core.counters.rx_bad_offset, 1, "{level:?}");
        assert_eq!(rig.a.changed_outside(&[]), None);
        let bufs = page::BUFS * PAGE;
        assert_eq!(rig.a.buf(0..2 * RECV), before[bufs..bufs + 2 * RECV], "{level:?}: nothing placed");
        // The frame took the peer's next sequence number: the peer's next
        // message is a duplicate here, the one after arrives.
        send_genuine(&mut rig, 1);
        send_genuine(&mut rig, 2);
        let got = next_receive(&mut rig);
        assert_intact(&rig, 2, 0, got);
        assert_untouched(&rig, 1, &format!("{level:?}"));
        for _ in 0..200 {
            rig.step();
        }
        assert_eq!(rig.a.done(Queue::Recv), None, "{level:?}: a receive completed with no genuine message for it");
        for h in [&rig.a, &rig.b] {
            assert_eq!(h.engine.core.vi(h.vi).unwrap().phase, ViPhase::Connected, "{level:?}");
            assert!(h.engine.core.async_errors.is_empty(), "{level:?}: {:?}", h.engine.core.async_errors);
        }
    }
}

/// A peer guessing memory handles: RDMA writes at the window's address with
/// the window's slot and other random bits. A reliable VI breaks at the
/// first; an unreliable one drops and reports each, and breaks when its
/// peer has tried [`UNRELIABLE_VIOLATION_LIMIT`] times. Nothing is written.
#[test]
fn guessing_memory_handles_breaks_the_connection() {
    for level in LEVELS {
        let mut rig = Rig::new(level);
        post_receives(&mut rig.a, 0..2);
        let before = rig.a.arena.snapshot();
        let mut tries = 0;
        while rig.a.engine.core.vi(rig.a.vi).unwrap().phase == ViPhase::Connected {
            tries += 1;
            assert!(tries <= UNRELIABLE_VIOLATION_LIMIT, "{level:?}: still connected after {tries} guesses");
            let mut h = rig.genuine(20);
            let guess = rig.a.handles.window ^ (tries << 16);
            (h.kind, h.rdma_handle, h.rdma_addr) = (Kind::RdmaWrite as u8, guess, rig.a.addr(page::WINDOW * PAGE));
            assert!(rig.inject(&frame_bytes(&h, &message(0xEE, 20))));
            rig.step();
        }
        let want = if level.is_reliable() { 1 } else { UNRELIABLE_VIOLATION_LIMIT };
        assert_eq!(tries, want, "{level:?}: guesses before the connection broke");
        assert_eq!(rig.a.engine.core.counters.rdma_prot_errors, want as u64, "{level:?}");
        assert_eq!(rig.a.arena.snapshot()[pages(page::WINDOW, 2)], before[pages(page::WINDOW, 2)], "{level:?}: the window changed");
        assert_eq!(rig.a.changed_outside(&[]), None, "{level:?}");
        let errs = &rig.a.engine.core.async_errors;
        assert!(!errs.is_empty() && errs.iter().all(|e| e.kind == AsyncErrorKind::RdmaWriteProt), "{level:?}: reported as such: {errs:?}");
        for slot in 0..2 {
            assert_untouched(&rig, slot, &format!("{level:?}"));
        }
    }
}
