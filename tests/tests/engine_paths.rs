//! The engine's transmit path and its receive path, each on its own (issue
//! 24): on the rig of `via_tests::rig`, one host runs while its peer stays
//! still, and the injector on the wire stands in for the peer: it sees
//! every frame the running host sends (checked field by field) and sends
//! it the ACKs, NAKs and data frames a test writes.
//!
//! Transmit: a message goes out as consecutive fragments carrying our
//! ACK; the window holds frames back until the peer acknowledges; an ACK
//! completes the send and stops the timer; a timeout sends again from the
//! oldest unacknowledged frame; a NAK with a SACK bitmap resends the holes
//! alone, and a frame the peer held and then refused goes again at the
//! timeout. Receive: a frame in order is placed and acknowledged once the
//! delay ran out; a frame past a gap is held and answered with a NAK whose
//! SACK bitmap names it, then placed when the gap fills; a duplicate is
//! acknowledged at once and placed once; a message's middle fragments
//! take the short road (header prediction) with their ACK, and one that
//! does not repeat the first, asks for an ACK or claims another message
//! goes the general way; a read whose memory went between two responses
//! completes with a protection error. After a timeout one burst goes
//! again, and the first ACK says whether the rest follows. Polls: a queue
//! counts as having nothing posted (a poll then runs no round) only once
//! all of it is handed back.

use std::time::Duration;
use via_device::FrameDevice;
use via_tests::rig::{frame_bytes, Host, Rig};
use via_user::descriptor::status;
use via_user::engine::post::Queue;
use via_user::vi::RTO_BURST;
use via_user::Reliability;
use via_wire::{flags, Frame, HeaderRepr, Kind, MacAddr};

/// One frame the injector saw.
#[derive(Clone, Debug)]
struct Seen {
    kind: Kind,
    flags: u16,
    src_vi: u16,
    psn: u32,
    ack: u32,
    msg_len: u32,
    offset: u32,
    msg_seq: u32,
    sack: u64,
    payload: Vec<u8>,
}

/// The rig with its injector tapping the wire (it sees every frame).
fn tapped(level: Reliability) -> Rig {
    let mut rig = Rig::new(level);
    rig.raw.set_promiscuous(true);
    rig
}

/// Every frame the injector saw since the last call, from the host whose
/// MAC is `mac`, in order.
fn seen(rig: &mut Rig, mac: MacAddr) -> Vec<Seen> {
    let mut out = Vec::new();
    while rig
        .raw
        .receive(64, &mut |b| {
            let f = Frame::new_checked(b).expect("the engine sends well-formed frames");
            if f.src_mac() == mac {
                out.push(Seen {
                    kind: f.kind().expect("a known kind"),
                    flags: f.flags(),
                    src_vi: f.src_vi(),
                    psn: f.psn(),
                    ack: f.ack(),
                    msg_len: f.msg_len(),
                    offset: f.offset(),
                    msg_seq: f.msg_seq(),
                    sack: f.rdma_addr(),
                    payload: f.payload().to_vec(),
                });
            }
        })
        .unwrap_or(0)
        > 0
    {}
    out
}

/// What the victim (a) sent since the last look.
fn seen_a(rig: &mut Rig) -> Vec<Seen> {
    let mac = rig.a.engine.core.mac;
    seen(rig, mac)
}

/// What the peer (b) sent since the last look.
fn seen_b(rig: &mut Rig) -> Vec<Seen> {
    let mac = rig.b.engine.core.mac;
    seen(rig, mac)
}

fn message(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
}

/// A standalone ACK (a NAK with `nak`) to host `to`'s VI as its peer
/// sends it: everything before `ack` arrived, and (SACK) bit `i` of `sack`
/// says PSN `ack + 1 + i` is held past the gap.
fn ack_to(to: &Host, ack: u32, nak: bool, sack: u64) -> Vec<u8> {
    let mut fl = flags::ACK | flags::RELIABLE;
    if nak {
        fl |= flags::ACK_REQ;
    }
    let h = HeaderRepr { kind: Kind::Ack as u8, flags: fl, ack, rdma_addr: sack, ..from_peer(to) };
    frame_bytes(&h, &[])
}

/// The addressing of a frame from host `to`'s peer to its VI (the rest
/// of the header default).
fn from_peer(to: &Host) -> HeaderRepr {
    let core = &to.engine.core;
    let vi = core.vi(to.vi).expect("the rig's VI");
    let peer = vi.peer.as_ref().expect("connected");
    HeaderRepr {
        dst_mac: core.mac,
        src_mac: peer.mac,
        dst_ep: core.ep,
        src_ep: peer.ep,
        dst_vi: to.vi,
        src_vi: peer.vi,
        generation: peer.generation,
        ..HeaderRepr::default()
    }
}

/// The PSN of b's next fragment.
fn b_next_psn(rig: &Rig) -> u32 {
    rig.b.engine.core.vi(rig.b.vi).unwrap().tx.psn
}

/// b sends `msg` from slot 0 at once (nothing else runs); returns the
/// PSN of its first fragment and the frames b sent for it.
fn b_sends(rig: &mut Rig, msg: &[u8]) -> (u32, Vec<Seen>) {
    seen_b(rig);
    let first = b_next_psn(rig);
    rig.b.post_send(0, 0, msg, None);
    rig.b.engine.ring_doorbell();
    (first, seen_b(rig))
}

// ---- transmit ----

#[test]
fn a_message_goes_out_as_consecutive_fragments_carrying_our_ack() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let msg = message(1, 3000);
    let expected_by_b = rig.b.engine.core.vi(rig.b.vi).unwrap().rx.expected;
    let (first, frames) = b_sends(&mut rig, &msg);
    let frag = frames[0].payload.len();
    assert_eq!(frames.len(), msg.len().div_ceil(frag), "fragments of {frag} bytes");
    let mut body = Vec::new();
    for (k, f) in frames.iter().enumerate() {
        assert_eq!((f.kind, f.src_vi), (Kind::Data, rig.b.vi));
        assert_eq!(f.psn, first.wrapping_add(k as u32), "consecutive PSNs");
        assert_eq!((f.msg_len, f.offset as usize), (msg.len() as u32, k * frag));
        assert_eq!(f.flags & flags::FIRST != 0, k == 0, "FIRST on the first fragment only");
        assert_eq!(f.flags & flags::LAST != 0, k == frames.len() - 1, "LAST on the last only");
        assert!(f.flags & flags::ACK != 0 && f.ack == expected_by_b, "each carries our ACK");
        body.extend_from_slice(&f.payload);
    }
    assert_eq!(body, msg);
    assert_eq!(rig.b.done(Queue::Send), None, "not complete before the peer acknowledges");
    assert!(rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().is_some(), "the retransmission timer runs");
}

#[test]
fn a_one_frame_message_alone_goes_out_as_the_general_path_sends_it() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let expected_by_b = rig.b.engine.core.vi(rig.b.vi).unwrap().rx.expected;
    let msg = message(7, 100);
    // Alone in its queue: the one-frame path (sent from the post).
    let (first, alone) = b_sends(&mut rig, &msg);
    // Two at once: the general path builds them (the first is not alone).
    rig.b.post_send(1, 0, &msg, None);
    rig.b.post_send(2, 0, &msg, None);
    rig.b.engine.ring_doorbell();
    let pair = seen_b(&mut rig);
    assert_eq!((alone.len(), pair.len()), (1, 2), "one frame a message");
    let (f, g) = (&alone[0], &pair[0]);
    assert_eq!((f.kind, f.src_vi, f.psn, f.msg_len, f.offset), (Kind::Data, rig.b.vi, first, 100, 0));
    assert_eq!(f.flags, g.flags, "the same flags as the general path's");
    let whole = flags::FIRST | flags::LAST | flags::ACK | flags::RELIABLE;
    assert_eq!(f.flags & (whole | flags::ACK_REQ), whole, "one whole message carrying our ACK, asking for none");
    assert_eq!((f.ack, g.ack), (expected_by_b, expected_by_b), "our ACK rides on it");
    assert_eq!((g.psn, pair[1].psn), (first.wrapping_add(1), first.wrapping_add(2)), "PSNs go on from it");
    assert_eq!((g.msg_seq, pair[1].msg_seq), (f.msg_seq.wrapping_add(1), f.msg_seq.wrapping_add(2)), "and message numbers");
    assert_eq!((&f.payload, &g.payload), (&msg, &msg));
    assert!(rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().is_some(), "the retransmission timer runs");
}

#[test]
fn an_ack_completes_the_send_and_stops_the_timer() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let (first, frames) = b_sends(&mut rig, &message(2, 3000));
    let n = frames.len() as u32;
    // Part of it acknowledged: nothing completes.
    rig.inject(&ack_to(&rig.b, first.wrapping_add(n - 1), false, 0));
    rig.b.engine.progress_at(rig.now);
    assert_eq!(rig.b.done(Queue::Send), None, "one fragment still unacknowledged");
    rig.inject(&ack_to(&rig.b, first.wrapping_add(n), false, 0));
    rig.b.engine.progress_at(rig.now);
    assert_eq!(rig.b.done(Queue::Send), Some(0));
    let (st, len, _) = rig.b.completion(0);
    assert_eq!((st & status::ERROR_MASK, st & status::DONE != 0, len), (0, true, 3000));
    assert!(rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().is_none(), "nothing outstanding: the timer stopped");
}

#[test]
fn the_window_holds_frames_back_until_acknowledged() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    // A window of 32 frames (the engine's is 2 MiB of frames, up to
    // 1,024: more than the rig's buffers and queues send at once).
    rig.b.engine.core.window = 32;
    let window = rig.b.engine.core.window;
    let first = b_next_psn(&rig);
    // Sixteen messages of 8000 bytes (one buffer, sent again and again):
    // more frames than the window.
    let msg = message(3, 8000);
    for slot in 0..16 {
        rig.b.post_send(slot, 0, &msg, None);
    }
    rig.b.engine.ring_doorbell();
    let frames = seen_b(&mut rig);
    let total = 16 * msg.len().div_ceil(frames[0].payload.len());
    assert!(total > window as usize, "the test needs more frames ({total}) than the window ({window})");
    assert_eq!(frames.len(), window as usize, "a window's worth, no more");
    assert!(frames.last().unwrap().flags & flags::ACK_REQ != 0, "the frame that fills the window asks for an ACK");
    assert!(frames[..frames.len() - 1].iter().all(|f| f.flags & flags::ACK_REQ == 0));
    // Ten acknowledged: ten more go.
    rig.inject(&ack_to(&rig.b, first.wrapping_add(10), false, 0));
    rig.b.engine.progress_at(rig.now);
    let more = seen_b(&mut rig);
    let data: Vec<_> = more.iter().filter(|f| f.kind == Kind::Data).collect();
    assert_eq!(data.len(), 10);
    assert_eq!(data[0].psn, first.wrapping_add(window), "from where the window stopped");
}

#[test]
fn a_timeout_sends_again_from_the_oldest_unacknowledged_frame() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let (first, sent) = b_sends(&mut rig, &message(4, 3000));
    rig.inject(&ack_to(&rig.b, first.wrapping_add(1), false, 0));
    rig.b.engine.progress_at(rig.now);
    let before = rig.b.engine.core.counters;
    let deadline = rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().expect("the timer runs");
    rig.b.engine.progress_at(deadline - Duration::from_micros(1));
    assert!(seen_b(&mut rig).iter().all(|f| f.kind != Kind::Data), "nothing before the timeout");
    rig.b.engine.progress_at(deadline);
    let again: Vec<_> = seen_b(&mut rig).into_iter().filter(|f| f.kind == Kind::Data).collect();
    let psns: Vec<u32> = again.iter().map(|f| f.psn).collect();
    let want: Vec<u32> = sent[1..].iter().map(|f| f.psn).collect();
    assert_eq!(psns, want, "everything from the oldest unacknowledged (go-back-N: the peer holds nothing past it)");
    assert!(again.iter().zip(&sent[1..]).all(|(a, s)| a.payload == s.payload && a.offset == s.offset), "the same fragments");
    let c = rig.b.engine.core.counters;
    assert_eq!((c.rto_expiries - before.rto_expiries, c.retransmits - before.retransmits), (1, want.len() as u64));
}

#[test]
fn a_nak_with_a_sack_resends_the_holes_alone() {
    let (mut rig, first) = b_sent_one_frame_messages(6);
    // The peer has first, misses first+1 and first+3, holds first+2, +4, +5:
    // SACK bit i is PSN ack + 1 + i.
    let ack = first.wrapping_add(1);
    let sack = 0b1101; // ack+1 (= first+2), ack+3, ack+4
    assert_eq!(resent_after_nak(&mut rig, first, sack), vec![1, 3], "the holes, once each");
    rig.inject(&ack_to(&rig.b, ack, true, sack));
    rig.b.engine.progress_at(rig.now);
    assert!(seen_b(&mut rig).iter().all(|f| f.kind != Kind::Data), "a repeated NAK sends no hole twice before a timeout");
    assert_eq!(rig.b.done(Queue::Send), Some(0), "the first message was acknowledged");
    assert_eq!(rig.b.done(Queue::Send), None);
}

/// Holes next to each other go again as a run (in one batch, so that a
/// device that carried the run as one datagram sends it so again; that
/// shows in the loss figures, not here): each hole once, in order, and
/// nothing the peer holds.
#[test]
fn a_run_of_holes_goes_again_in_order_once_each() {
    let (mut rig, first) = b_sent_one_frame_messages(8);
    // The peer has first, misses first+1..=first+4 and first+6, holds
    // first+5 and first+7.
    let sack = 1 << 3 | 1 << 5; // bit i is PSN first + 2 + i: first+5, first+7
    assert_eq!(resent_after_nak(&mut rig, first, sack), vec![1, 2, 3, 4, 6], "the run first+1..=first+4, then the hole first+6");
}

/// A rig in which b has sent `n` one-frame messages from slots 0..n;
/// returns it and the first one's PSN.
fn b_sent_one_frame_messages(n: usize) -> (Rig, u32) {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let first = b_next_psn(&rig);
    for slot in 0..n {
        rig.b.post_send(slot, slot * 100, &message(5 + slot as u8, 100), None);
    }
    rig.b.engine.ring_doorbell();
    assert_eq!(seen_b(&mut rig).len(), n);
    (rig, first)
}

/// What b sends again (PSNs less `first`) after a NAK at `first + 1` with
/// SACK bitmap `sack`.
fn resent_after_nak(rig: &mut Rig, first: u32, sack: u64) -> Vec<u32> {
    rig.inject(&ack_to(&rig.b, first.wrapping_add(1), true, sack));
    rig.b.engine.progress_at(rig.now);
    seen_b(rig).iter().filter(|f| f.kind == Kind::Data).map(|f| f.psn.wrapping_sub(first)).collect()
}

// ---- receive ----

/// The data frame with PSN `psn` of a one-fragment message `msg_seq` of
/// `payload` from the peer (b) to the victim (a).
fn data_to_a(rig: &Rig, psn: u32, msg_seq: u32, payload: &[u8]) -> Vec<u8> {
    let h = HeaderRepr { psn, msg_seq, flags: flags::FIRST | flags::LAST | flags::RELIABLE, ..rig.genuine(payload.len()) };
    frame_bytes(&h, payload)
}

#[test]
fn a_frame_in_order_is_placed_and_acknowledged_once_the_delay_ran_out() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    rig.a.post_recv(0, &[0..512]);
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let msg = message(7, 300);
    rig.inject(&data_to_a(&rig, psn, 0, &msg));
    seen_a(&mut rig);
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.done(Queue::Recv), Some(0));
    let (st, len, _) = rig.a.completion(0);
    assert_eq!((st & status::ERROR_MASK, len), (0, 300));
    assert_eq!(rig.a.buf(0..300), msg);
    assert!(seen_a(&mut rig).is_empty(), "the ACK waits for a frame to ride on");
    let delay = rig.a.engine.core.config.ack_delay;
    rig.a.engine.progress_at(rig.now + delay);
    let acks = seen_a(&mut rig);
    assert_eq!(acks.len(), 1, "one delayed ACK");
    assert_eq!((acks[0].kind, acks[0].ack, acks[0].flags & flags::ACK_REQ), (Kind::Ack, psn.wrapping_add(1), 0));
}

#[test]
fn a_frame_past_a_gap_is_held_naked_and_placed_when_the_gap_fills() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    rig.a.post_recv(0, &[0..512]);
    rig.a.post_recv(1, &[512..1024]);
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let (m0, m1) = (message(8, 200), message(9, 250));
    seen_a(&mut rig);
    rig.inject(&data_to_a(&rig, psn.wrapping_add(1), 1, &m1));
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.done(Queue::Recv), None, "held, not placed");
    let nak = seen_a(&mut rig);
    assert_eq!(nak.len(), 1);
    assert!(nak[0].kind == Kind::Ack && nak[0].flags & flags::ACK_REQ != 0, "a NAK at once");
    assert_eq!((nak[0].ack, nak[0].sack), (psn, 1), "the gap at psn; psn + 1 held (SACK bit 0)");
    rig.inject(&data_to_a(&rig, psn, 0, &m0));
    rig.a.engine.progress_at(rig.now);
    assert_eq!((rig.a.done(Queue::Recv), rig.a.done(Queue::Recv)), (Some(0), Some(1)), "both, in order");
    assert_eq!((rig.a.buf(0..200), rig.a.buf(512..762)), (m0, m1));
    assert_eq!(rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected, psn.wrapping_add(2));
}

#[test]
fn a_duplicate_is_acknowledged_at_once_and_placed_once() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    rig.a.post_recv(0, &[0..512]);
    rig.a.post_recv(1, &[512..1024]);
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let frame = data_to_a(&rig, psn, 0, &message(10, 100));
    rig.inject(&frame);
    rig.a.engine.progress_at(rig.now);
    // The delayed ACK goes out: nothing is owed any more.
    rig.a.engine.progress_at(rig.now + rig.a.engine.core.config.ack_delay);
    assert_eq!(seen_a(&mut rig).len(), 1);
    let dups = rig.a.engine.core.counters.rx_duplicate;
    rig.inject(&frame);
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.engine.core.counters.rx_duplicate, dups + 1);
    let acks = seen_a(&mut rig);
    assert_eq!(acks.len(), 1, "an ACK at once, though none was owed: the peer missed ours");
    assert_eq!((acks[0].kind, acks[0].ack), (Kind::Ack, psn.wrapping_add(1)));
    assert_eq!((rig.a.done(Queue::Recv), rig.a.done(Queue::Recv)), (Some(0), None), "placed once");
}

#[test]
fn a_receive_deregistered_between_fragments_completes_with_a_protection_error_and_takes_no_more() {
    use via_tests::rig::arena::{page, PAGE};
    let mut rig = tapped(Reliability::ReliableDelivery);
    // One segment, checked at post: the fragments are placed by the
    // one-segment path while its check stands, not after.
    rig.a.post_recv(0, &[0..512]);
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let msg = message(11, 400);
    let fragment = |rig: &Rig, k: u32, fl: u16| {
        let (off, n) = (200 * k as usize, 200);
        let h = HeaderRepr { psn: psn.wrapping_add(k), msg_seq: 0, flags: fl | flags::RELIABLE, msg_len: 400, offset: off as u32, ..rig.genuine(n) };
        frame_bytes(&h, &msg[off..off + n])
    };
    rig.inject(&fragment(&rig, 0, flags::FIRST));
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.buf(0..200), msg[..200], "the first fragment placed");
    let before = rig.a.buf(200..400);
    let bufs = rig.a.arena.addr(page::BUFS * PAGE);
    rig.a.engine.deregister_memory(bufs, rig.a.handles.bufs).unwrap();
    rig.inject(&fragment(&rig, 1, flags::LAST));
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.done(Queue::Recv), Some(0));
    let (st, _, _) = rig.a.completion(0);
    assert_eq!(st & status::ERROR_MASK, status::PROTECTION_ERROR);
    assert_eq!(rig.a.buf(200..400), before, "nothing written after the memory went");
    assert_eq!(rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected, psn.wrapping_add(2), "both fragments taken in order");
}

/// Fragment `k` (of 200 bytes) of an 800-byte message `msg_seq` whose
/// first fragment is PSN `psn`, from the peer (b) to the victim (a),
/// carrying b's ACK `ack`; `fl`: FIRST or LAST where it is either.
fn fragment_to_a(rig: &Rig, psn: u32, msg_seq: u32, k: u32, fl: u16, ack: u32, msg: &[u8]) -> Vec<u8> {
    let off = 200 * k as usize;
    let h = HeaderRepr { psn: psn.wrapping_add(k), msg_seq, flags: fl | flags::RELIABLE | flags::ACK, ack, msg_len: 800, offset: off as u32, ..rig.genuine(200) };
    frame_bytes(&h, &msg[off..off + 200])
}

#[test]
fn a_message_s_middle_fragments_take_the_short_road_with_their_ack() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    rig.a.post_recv(0, &[0..1024]);
    // a sends first: the peer's second fragment acknowledges it.
    rig.a.post_send(1, 2048, &message(3, 100), None);
    rig.a.engine.ring_doorbell();
    let sent = seen_a(&mut rig);
    assert_eq!(sent.len(), 1);
    let a_psn = sent[0].psn;
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let msg = message(12, 800);
    let before = rig.a.engine.core.counters;
    for (k, fl) in [(0, flags::FIRST), (1, 0), (2, 0), (3, flags::LAST)] {
        let ack = if k == 0 { a_psn } else { a_psn.wrapping_add(1) };
        rig.inject(&fragment_to_a(&rig, psn, 0, k, fl, ack, &msg));
        rig.a.engine.progress_at(rig.now);
        if k == 1 {
            assert_eq!(rig.a.done(Queue::Send), Some(1), "the ACK a middle fragment carries completes our send");
        }
    }
    let after = rig.a.engine.core.counters;
    assert_eq!(after.rx_continued - before.rx_continued, 2, "the two middle fragments took the short road");
    assert_eq!(rig.a.done(Queue::Recv), Some(0));
    let (st, len, _) = rig.a.completion(0);
    assert_eq!((st & status::ERROR_MASK, len), (0, 800));
    assert_eq!(rig.a.buf(0..800), msg);
    assert_eq!(rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected, psn.wrapping_add(4));
    assert_eq!(after.acks_by_count, before.acks_by_count, "four frames owe no ACK by count");
}

#[test]
fn a_middle_fragment_that_does_not_repeat_its_first_goes_the_general_way() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    rig.a.post_recv(0, &[0..1024]);
    let psn = rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected;
    let ack = rig.a.engine.core.vi(rig.a.vi).unwrap().tx.una;
    let msg = message(13, 800);
    rig.inject(&fragment_to_a(&rig, psn, 0, 0, flags::FIRST, ack, &msg));
    rig.a.engine.progress_at(rig.now);
    let before = rig.a.engine.core.counters;
    // The next fragment as another VI of the peer's host would send it,
    // with other bytes: not the peer's, so dropped as stale, not placed.
    let mut forged = fragment_to_a(&rig, psn, 0, 1, 0, ack, &message(14, 800));
    let h = HeaderRepr { src_vi: rig.genuine(0).src_vi.wrapping_add(1), ..HeaderRepr::parse(&Frame::new_checked(&forged[..]).unwrap()) };
    let mut head = [0u8; via_wire::FRAME_HEADER_LEN];
    h.emit(&mut head);
    forged[..head.len()].copy_from_slice(&head);
    rig.inject(&forged);
    rig.a.engine.progress_at(rig.now);
    let after = rig.a.engine.core.counters;
    assert_eq!((after.rx_continued, after.rx_stale - before.rx_stale), (before.rx_continued, 1));
    assert_eq!(rig.a.engine.core.vi(rig.a.vi).unwrap().rx.expected, psn.wrapping_add(1), "not taken");
    // The genuine rest, a middle fragment asking for an ACK among them
    // (the general path's: it owes one at once), completes the message.
    for (k, fl) in [(1, 0), (2, flags::ACK_REQ), (3, flags::LAST)] {
        rig.inject(&fragment_to_a(&rig, psn, 0, k, fl, ack, &msg));
        rig.a.engine.progress_at(rig.now);
    }
    assert_eq!(rig.a.engine.core.counters.rx_continued - before.rx_continued, 1, "only the plain middle fragment");
    assert_eq!(rig.a.done(Queue::Recv), Some(0));
    assert_eq!(rig.a.buf(0..800), msg, "the forged bytes were not placed");
    assert!(seen_a(&mut rig).iter().any(|f| f.kind == Kind::Ack && f.ack == psn.wrapping_add(3)), "the ACK asked for went at once");
    // A middle fragment that claims another message at the right place
    // breaks the connection, as on the general path.
    rig.a.post_recv(1, &[1024..2048]);
    rig.inject(&fragment_to_a(&rig, psn.wrapping_add(4), 1, 0, flags::FIRST, ack, &msg));
    rig.a.engine.progress_at(rig.now);
    let lost = rig.a.engine.core.counters.connections_lost;
    rig.inject(&fragment_to_a(&rig, psn.wrapping_add(4), 2, 1, 0, ack, &msg));
    rig.a.engine.progress_at(rig.now);
    let c = rig.a.engine.core.counters;
    assert_eq!((c.rx_bad_offset > before.rx_bad_offset, c.connections_lost, c.rx_continued - before.rx_continued), (true, lost + 1, 1));
}

#[test]
fn a_read_whose_memory_was_deregistered_between_responses_completes_with_a_protection_error() {
    use via_tests::rig::arena::{page, PAGE};
    use via_tests::rig::Seg;
    use via_user::descriptor::control;
    let mut rig = tapped(Reliability::ReliableDelivery);
    // a reads 400 bytes of the peer's window into its buffers, one local
    // segment, checked at post: the first response is placed from that
    // check, the second after the memory went (the check no longer
    // stands) not at all.
    let remote = Seg { addr: rig.b.addr(page::WINDOW * PAGE), handle: rig.b.handles.window, len: 0 };
    let local = Seg { addr: rig.a.addr(page::BUFS * PAGE), handle: rig.a.handles.bufs, len: 400 };
    rig.a.write_desc(1, control::OP_RDMAREAD, 0, 400, &[remote, local]);
    rig.a.post(1, Queue::Send).expect("posting an RDMA read");
    seen_a(&mut rig);
    rig.a.engine.ring_doorbell();
    let req = seen_a(&mut rig);
    assert_eq!((req.len(), req[0].kind), (1, Kind::RdmaReadReq));
    let (psn, msg_seq) = (req[0].psn, req[0].msg_seq);
    let body = message(15, 400);
    let response = |rig: &Rig, k: usize, fl: u16| {
        let h = HeaderRepr { kind: Kind::RdmaReadResp as u8, psn, msg_seq, flags: fl | flags::RELIABLE, msg_len: 400, offset: 200 * k as u32, ..rig.genuine(200) };
        frame_bytes(&h, &body[200 * k..200 * (k + 1)])
    };
    rig.inject(&response(&rig, 0, 0));
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.buf(0..200), body[..200], "the first response placed");
    assert_eq!(rig.a.done(Queue::Send), None);
    let before = rig.a.buf(200..400);
    let bufs = rig.a.arena.addr(page::BUFS * PAGE);
    rig.a.engine.deregister_memory(bufs, rig.a.handles.bufs).unwrap();
    rig.inject(&response(&rig, 1, flags::LAST));
    rig.a.engine.progress_at(rig.now);
    assert_eq!(rig.a.done(Queue::Send), Some(1));
    let (st, _, _) = rig.a.completion(1);
    assert_eq!(st & status::ERROR_MASK, status::PROTECTION_ERROR);
    assert_eq!(rig.a.buf(200..400), before, "nothing written after the memory went");
}

/// A one-frame message from a to b as a sends it, carrying a's ACK `ack`
/// (no SACK: a data frame has none).
fn data_to_b_acking(rig: &Rig, ack: u32, payload: &[u8]) -> Vec<u8> {
    let h = HeaderRepr {
        kind: Kind::Data as u8,
        flags: flags::FIRST | flags::LAST | flags::RELIABLE | flags::ACK,
        psn: rig.b.engine.core.vi(rig.b.vi).expect("the rig's VI").rx.expected,
        ack,
        msg_len: payload.len() as u32,
        payload_len: payload.len() as u16,
        ..from_peer(&rig.b)
    };
    frame_bytes(&h, payload)
}

/// The peer held frames past a gap, took the gap, then refused (receiver
/// not ready) the first frame it had held: it expects that frame again.
/// Its ACK for the gap rides on a data frame (no SACK), so the sender's
/// last SACK still says the frame is held; a timeout must send it again
/// all the same (it once sent only what lay past the frames held, and the
/// connection stalled for good).
#[test]
fn a_frame_the_peer_held_and_then_refused_goes_again_at_the_timeout() {
    let (mut rig, first) = b_sent_one_frame_messages(4);
    // The peer has `first`, misses first+1 and holds first+2 and first+3.
    assert_eq!(resent_after_nak(&mut rig, first, 0b11), vec![1], "the hole");
    // It took first+1, and refused first+2 as it replayed it: it expects
    // first+2 again, and still holds first+3.
    rig.b.post_recv(10, &[2048..2560]);
    rig.inject(&data_to_b_acking(&rig, first.wrapping_add(2), &message(9, 50)));
    rig.b.engine.progress_at(rig.now);
    assert_eq!(rig.b.done(Queue::Recv), Some(10), "the data frame was taken");
    assert_eq!(rig.b.engine.core.vi(rig.b.vi).unwrap().tx.una, first.wrapping_add(2));
    seen_b(&mut rig);
    let deadline = rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().expect("frames are outstanding: the timer runs");
    rig.b.engine.progress_at(deadline);
    let again: Vec<u32> = seen_b(&mut rig).iter().filter(|f| f.kind == Kind::Data).map(|f| f.psn.wrapping_sub(first)).collect();
    assert_eq!(again, vec![2], "the frame the peer refused, and not the one it holds");
}

/// A poll runs no round for a queue with nothing posted
/// (`Core::nothing_posted`, which `RawNic::vi_done` asks). So the
/// predicate must say "nothing" only then: a posted descriptor keeps its
/// queue busy until it has completed and been handed back, or a program
/// that drives the engine by polling would wait for ever.
#[test]
fn a_queue_counts_as_having_nothing_posted_only_once_all_is_handed_back() {
    let mut rig = Rig::new(Reliability::ReliableDelivery);
    let (va, vb) = (rig.a.vi, rig.b.vi);
    assert!(rig.a.engine.core.nothing_posted(va, Queue::Recv));
    assert!(rig.b.engine.core.nothing_posted(vb, Queue::Send));
    rig.a.post_recv(0, &[0..64]);
    rig.b.post_send(1, 0, &[7u8; 32], None);
    assert!(!rig.a.engine.core.nothing_posted(va, Queue::Recv), "a posted receive");
    assert!(!rig.b.engine.core.nothing_posted(vb, Queue::Send), "a posted send");
    let both_done = |r: &mut Rig| r.a.completion(0).0 & status::DONE != 0 && r.b.completion(1).0 & status::DONE != 0;
    assert!(rig.step_until(1000, both_done), "the send and its receive complete");
    assert!(!rig.a.engine.core.nothing_posted(va, Queue::Recv), "completed, not yet handed back");
    assert!(!rig.b.engine.core.nothing_posted(vb, Queue::Send), "completed, not yet handed back");
    assert_eq!(rig.a.done(Queue::Recv), Some(0));
    assert_eq!(rig.b.done(Queue::Send), Some(1));
    assert!(rig.a.engine.core.nothing_posted(va, Queue::Recv));
    assert!(rig.b.engine.core.nothing_posted(vb, Queue::Send));
    // An id that names no VI: not "nothing posted" (the poll reports it).
    assert!(!rig.a.engine.core.nothing_posted(999, Queue::Send));
}

/// b sends twelve 6000-byte messages (60 fragments at the rig's MTU) and
/// nothing acknowledges them until its retransmission timeout; returns
/// the first fragment's PSN and how many fragments went.
fn b_sent_sixty_frames_and_timed_out(rig: &mut Rig) -> (u32, u32) {
    seen_b(rig);
    let first = b_next_psn(rig);
    for slot in 0..12 {
        rig.b.post_send(slot, 0, &message(slot as u8, 6000), None);
    }
    rig.b.engine.ring_doorbell();
    let n = seen_b(rig).iter().filter(|f| f.kind == Kind::Data).count() as u32;
    assert!(n > RTO_BURST, "{n} fragments: more than a burst");
    let deadline = rig.b.engine.core.vi(rig.b.vi).unwrap().rtx.deadline().expect("the timer runs");
    rig.b.engine.progress_at(deadline);
    (first, n)
}

/// After a timeout the sender sends one burst again, its last frame
/// asking for an ACK, and waits; an ACK that covers frames never sent
/// again (the peer had the first transmissions: the timeout was
/// spurious) ends the going back, and nothing more goes again.
#[test]
fn after_a_timeout_a_burst_goes_again_and_an_ack_past_it_ends_the_going_back() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let (first, n) = b_sent_sixty_frames_and_timed_out(&mut rig);
    let again: Vec<Seen> = seen_b(&mut rig).into_iter().filter(|f| f.kind == Kind::Data).collect();
    let psns: Vec<u32> = again.iter().map(|f| f.psn.wrapping_sub(first)).collect();
    assert_eq!(psns, (0..RTO_BURST).collect::<Vec<_>>(), "one burst from the oldest unacknowledged");
    assert!(again.last().unwrap().flags & flags::ACK_REQ != 0, "the burst's last frame asks for an ACK");
    // The peer acknowledges 40 frames: 8 of them were never sent again.
    rig.inject(&ack_to(&rig.b, first.wrapping_add(40), false, 0));
    rig.b.engine.progress_at(rig.now);
    let more = seen_b(&mut rig).into_iter().filter(|f| f.kind == Kind::Data).count();
    assert_eq!(more, 0, "the first transmissions are arriving: nothing of {}..{n} goes again", 40);
    rig.inject(&ack_to(&rig.b, first.wrapping_add(n), false, 0));
    rig.b.engine.progress_at(rig.now);
    assert!((0..12).all(|slot| rig.b.completion(slot).0 & status::DONE != 0), "every send completes");
}

/// An ACK after a timeout's burst that covers only what went again: the
/// loss was real, and the rest goes again (go-back-N).
#[test]
fn after_a_timeout_an_ack_within_the_burst_sends_the_rest_again() {
    let mut rig = tapped(Reliability::ReliableDelivery);
    let (first, n) = b_sent_sixty_frames_and_timed_out(&mut rig);
    seen_b(&mut rig);
    rig.inject(&ack_to(&rig.b, first.wrapping_add(RTO_BURST), false, 0));
    rig.b.engine.progress_at(rig.now);
    let psns: Vec<u32> = seen_b(&mut rig).iter().filter(|f| f.kind == Kind::Data).map(|f| f.psn.wrapping_sub(first)).collect();
    assert_eq!(psns, (RTO_BURST..n).collect::<Vec<_>>(), "everything past the burst, once");
}
