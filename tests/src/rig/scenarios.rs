//! The fuzz targets' bodies (`fuzz/fuzz_targets/` calls them; regression
//! tests call them with the inputs that once failed): each decodes its
//! input into a run and panics when an invariant breaks.
//!
//! - [`parse_frame`]: the wire parsers on arbitrary bytes.
//! - [`receive_path`] (in `super::receive_path`): arbitrary frames at a
//!   live VI amid genuine traffic both ways; the genuine messages arrive
//!   exactly once, in order, intact, no hostile byte lands anywhere, and
//!   the connection stays up unless a violation by the peer broke it.
//! - [`post_descriptors`]: arbitrary descriptors posted by the peer; each
//!   is refused or completes, nothing outside their reach changes, and no
//!   receive of the other side holds a byte past the length it completed
//!   with.

pub use super::receive_path::receive_path;

use super::arena::{page, PAGE, SLOT_SEGMENTS};
use super::input::Input;
use super::{slot_offset, Host, Rig, Seg};
use via_wire::{self as wire, ConnRepr, Frame, HeaderRepr, Kind, WireError, ETHERTYPE, FRAME_HEADER_LEN, VERSION};
use via_user::descriptor::control;
use via_user::engine::post::Queue;
use via_user::Reliability;

const LEVELS: [Reliability; 3] = [Reliability::Unreliable, Reliability::ReliableDelivery, Reliability::ReliableReception];

/// The parsers: a frame is accepted exactly when it is well formed, its
/// header emits back to the same bytes, a sealed copy checks, and
/// connection attributes survive emit and parse.
pub fn parse_frame(data: &[u8]) {
    match Frame::new_checked(data) {
        Ok(f) => {
            let h = HeaderRepr::parse(&f);
            let mut head = [0u8; FRAME_HEADER_LEN];
            h.emit(&mut head);
            assert_eq!(&head[..], &data[..FRAME_HEADER_LEN], "emit(parse(header)) differs");
            let p = f.payload();
            assert_eq!(p, &data[FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.payload_len as usize]);
            let _ = f.checksum_ok();
            wire::seal(&mut head, [p]);
            let mut sealed = head.to_vec();
            sealed.extend_from_slice(p);
            assert!(Frame::new_checked(&sealed[..]).expect("a sealed copy parses").checksum_ok(), "a sealed frame fails its checksum");
            let lent = Frame::new_checked_lent(&data[..FRAME_HEADER_LEN], p.len()).expect("the header alone, payload lent");
            assert!(lent.payload().is_empty());
            conn_roundtrip(p);
        }
        Err(e) => {
            let want = if data.len() < FRAME_HEADER_LEN {
                WireError::Truncated
            } else if data[12..14] != ETHERTYPE.to_be_bytes() {
                WireError::NotVia
            } else if data[14] != VERSION {
                WireError::BadVersion
            } else if Kind::from_u8(data[15]).is_none() {
                WireError::BadKind
            } else {
                // An authenticated frame's tag follows its payload.
                let tag = if u16::from_be_bytes([data[16], data[17]]) & wire::flags::AUTH != 0 { wire::TAG_LEN } else { 0 };
                assert!(FRAME_HEADER_LEN + u16::from_be_bytes([data[68], data[69]]) as usize + tag > data.len(), "a well-formed frame refused");
                WireError::BadLength
            };
            assert_eq!(e, want);
        }
    }
    conn_roundtrip(data);
}

fn conn_roundtrip(p: &[u8]) {
    if let Ok(c) = ConnRepr::parse(p) {
        let mut out = vec![0u8; c.len()];
        assert_eq!(c.emit(&mut out), c.len());
        assert_eq!(ConnRepr::parse(&out), Ok(c), "connection attributes changed through emit and parse");
    }
}

fn level(inp: &mut Input) -> Reliability {
    inp.pick(&LEVELS)
}

/// One arbitrary segment: a region of `h` (or none), a handle that may
/// not be its own, an offset that may run past it, any length.
fn segment(h: &Host, inp: &mut Input) -> Seg {
    let sel = inp.u8();
    let (first, n, own) = match sel % 8 {
        0 => (page::DESCS, 1, h.handles.descs),
        1 | 2 => (page::BUFS, 2, h.handles.bufs),
        3 => (page::WINDOW, 2, h.handles.window),
        4 => (page::CLOSED, 1, h.handles.closed),
        5 => (page::FOREIGN, 1, h.handles.foreign),
        6 => (page::GUARD_LO, 1, h.handles.bufs),
        _ => (page::GUARD_HI, 1, h.handles.window),
    };
    let handle = match (sel >> 3) % 4 {
        0 | 1 => own,
        2 => [h.handles.descs, h.handles.bufs, h.handles.window, h.handles.closed, h.handles.foreign][(sel >> 5) as usize % 5],
        _ => inp.u32(),
    };
    let off = inp.u16() as usize % (n * PAGE + 64);
    let len = if sel & 0x80 != 0 { inp.u32() } else { u32::from(inp.u16()) % 3000 };
    Seg { addr: h.addr(first * PAGE + off), handle, len }
}

/// Arbitrary descriptors posted on the peer's queues: each is refused by
/// the post or completes (sends while connected, everything once the VI
/// disconnects), and no memory outside their reach changes.
pub fn post_descriptors(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut rig = Rig::new(level(&mut inp));
    for k in 0..4 {
        rig.a.post_recv(k, &[k * 2000..k * 2000 + 700, k * 2000 + 700..(k + 1) * 2000]);
    }
    let mut posted = Vec::new();
    for slot in 0..12 {
        if inp.is_empty() {
            break;
        }
        let bits = inp.u8();
        let q = if bits & 1 != 0 { Queue::Recv } else { Queue::Send };
        let mut ctl = u16::from(bits >> 1) & 0xf;
        if bits & 0x40 != 0 {
            ctl |= inp.u16() & control::RESERVED;
        }
        let nsegs = inp.u8() as usize % (SLOT_SEGMENTS + 1);
        let rdma = matches!(ctl & control::OP_MASK, control::OP_RDMAWRITE | control::OP_RDMAREAD);
        let segs: Vec<Seg> = (0..nsegs).map(|i| if rdma && i == 0 { segment(&rig.a, &mut inp) } else { segment(&rig.b, &mut inp) }).collect();
        let total: u32 = segs.iter().skip(usize::from(rdma)).fold(0u32, |t, s| t.wrapping_add(s.len));
        let length = if bits & 0x80 != 0 { inp.u32() } else { total };
        let b = &mut rig.b;
        b.write_desc(slot, ctl, inp.u32(), length, &segs);
        let how = inp.u8();
        if how & 1 != 0 {
            // A segment count past what was written (or past the page).
            let count = inp.u16().to_ne_bytes();
            b.write(slot_offset(slot) + 12, &count);
        }
        let (addr, handle) = match (how >> 1) % 8 {
            0 => (b.arena.addr(slot_offset(slot) + 8 * ((how >> 4) as usize % 7 + 1)), b.handles.descs),
            1 => (b.arena.addr(slot_offset(slot)), b.handles.bufs),
            2 => (b.arena.addr(slot_offset(slot)), inp.u32()),
            _ => (b.arena.addr(slot_offset(slot)), b.handles.descs),
        };
        if b.engine.core.post(b.vi, addr, handle, q).is_ok() {
            posted.push((slot, q));
        }
        if how & 0x80 != 0 {
            rig.step();
        }
    }
    // Completion is read from the queues, not the status words: a
    // descriptor's own RDMA read may legitimately scatter over them.
    let mut done = Vec::new();
    let sends = posted.iter().filter(|p| p.1 == Queue::Send).count();
    let all_sent = rig.step_until(30_000, |r| {
        done.extend(std::iter::from_fn(|| r.b.done(Queue::Send)).map(|s| (s, Queue::Send)));
        done.len() == sends
    });
    assert!(all_sent, "of {posted:?}, only the sends {done:?} completed");
    rig.b.engine.core.disconnect(rig.b.vi).expect("disconnecting the peer");
    done.extend(std::iter::from_fn(|| rig.b.done(Queue::Recv)).map(|s| (s, Queue::Recv)));
    done.sort_by_key(|d| d.0);
    assert_eq!(done, posted, "posted descriptors that never completed");
    for _ in 0..10 {
        rig.step();
    }
    // The receiver's receives (all completed by now, flushed if nothing
    // came): no byte past the length each completed with changed.
    let mut lengths = [0usize; 4];
    while let Some(slot) = rig.a.done(Queue::Recv) {
        assert!(slot < 4, "the receiver completed slot {slot}, never posted");
        lengths[slot] = rig.a.completion(slot).1 as usize;
    }
    for (k, len) in lengths.into_iter().enumerate() {
        let tail = page::BUFS * PAGE + k * 2000 + len.min(2000)..page::BUFS * PAGE + (k + 1) * 2000;
        let changed = rig.a.arena.read(tail.clone()).iter().zip(rig.a.original(tail.clone())).position(|(now, then)| now != then);
        if let Some(i) = changed {
            panic!("the receiver's receive {k} completed with {len} bytes, yet its byte {} changed", len + i);
        }
    }
    if let Some(at) = rig.a.changed_outside(&[]) {
        panic!("the receiver's byte {at:#x} changed: the sender reached memory it may not");
    }
    // The sender's own descriptors may write anywhere its tag reaches (RDMA
    // reads scatter into its memory): only the foreign page and the guards stay.
    if let Some(at) = rig.b.changed_outside(std::slice::from_ref(&(page::DESCS * PAGE..page::FOREIGN * PAGE))) {
        panic!("the sender's byte {at:#x} changed: outside its protection tag");
    }
}
