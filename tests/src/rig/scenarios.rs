//! The fuzz targets' bodies (`fuzz/fuzz_targets/` calls them; regression
//! tests call them with the inputs that once failed): each decodes its
//! input into a run and panics when an invariant breaks.
//!
//! - [`parse_frame`]: the wire parsers on arbitrary bytes.
//! - [`receive_path`]: arbitrary frames (with chosen fields set to what
//!   the genuine peer would send) at a live VI amid genuine traffic; no
//!   memory but what a legitimate peer may write changes.
//! - [`post_descriptors`]: arbitrary descriptors posted by the peer; each
//!   is refused or completes, and nothing outside their reach changes.

use super::arena::{page, PAGE, SLOT_SEGMENTS};
use super::input::Input;
use super::{slot_offset, Host, Rig, Seg};
use via_kernel_agent::wire::{self, ConnRepr, Frame, HeaderRepr, Kind, WireError, ETHERTYPE, FRAME_HEADER_LEN, VERSION};
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
                assert!(FRAME_HEADER_LEN + u16::from_be_bytes([data[68], data[69]]) as usize > data.len(), "a well-formed frame refused");
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

/// Frame byte ranges of header fields.
mod at {
    use std::ops::Range;
    pub const DST_MAC: Range<usize> = 0..6;
    pub const SRC_MAC: Range<usize> = 6..12;
    pub const TYPE_VERSION: Range<usize> = 12..15;
    pub const KIND: usize = 15;
    pub const FLAGS: Range<usize> = 16..18;
    pub const DST_EP: Range<usize> = 18..22;
    pub const SRC_EP: Range<usize> = 22..26;
    pub const DST_VI: Range<usize> = 26..28;
    pub const SRC_VI: Range<usize> = 28..30;
    pub const GENERATION: Range<usize> = 30..34;
    pub const PSN: Range<usize> = 34..38;
    pub const ACK: Range<usize> = 38..42;
    pub const MSG_LEN: Range<usize> = 42..46;
    pub const OFFSET: Range<usize> = 46..50;
    pub const RDMA_ADDR: Range<usize> = 54..62;
    pub const RDMA_HANDLE: Range<usize> = 62..66;
    pub const PAYLOAD_LEN: Range<usize> = 68..70;
    pub const MSG_SEQ: Range<usize> = 70..74;
}

const KINDS: [Kind; 15] = [
    Kind::Data,
    Kind::Ack,
    Kind::RdmaWrite,
    Kind::RdmaReadReq,
    Kind::RdmaReadResp,
    Kind::Disconnect,
    Kind::ConnRequest,
    Kind::ConnPending,
    Kind::ConnAccept,
    Kind::ConnReject,
    Kind::ConnNoMatch,
    Kind::PeerRequest,
    Kind::PeerAccept,
    Kind::NameQuery,
    Kind::NameReply,
];

/// A frame from the input: its bytes as given, then the fields that the
/// 16 bits of `fix` select set to what the genuine peer would send.
fn hostile_frame(rig: &Rig, inp: &mut Input) -> Vec<u8> {
    let len = inp.u16() as usize % 3000;
    let fix = inp.u16();
    let mut f = inp.take(len).to_vec();
    let a = &rig.a;
    if f.len() < FRAME_HEADER_LEN {
        if fix & 1 == 0 && f.len() >= 6 {
            f[at::DST_MAC].copy_from_slice(&a.engine.core.mac.0);
        }
        return f;
    }
    let payload = f.len() - FRAME_HEADER_LEN;
    let mut g = [0u8; FRAME_HEADER_LEN];
    let mut h = rig.genuine(payload);
    let vi = a.engine.core.vi(a.vi).expect("the victim VI");
    if let Some(m) = vi.rx.as_ref() {
        (h.msg_seq, h.msg_len, h.offset) = (m.msg_seq, m.msg_len, m.got);
    }
    let span = vi.sent_hi.wrapping_sub(vi.una).wrapping_add(1).max(1);
    h.ack = vi.una.wrapping_add(u32::from_be_bytes(f[at::ACK].try_into().unwrap()) % span);
    let (base, handle, size) = match f[at::RDMA_HANDLE.start] % 5 {
        0 => (page::WINDOW, a.handles.window, 2),
        1 => (page::CLOSED, a.handles.closed, 1),
        2 => (page::FOREIGN, a.handles.foreign, 1),
        3 => (page::BUFS, a.handles.bufs, 2),
        _ => (page::DESCS, a.handles.window, 1),
    };
    let raw_addr = u64::from_be_bytes(f[at::RDMA_ADDR].try_into().unwrap());
    h.rdma_addr = a.addr(base * PAGE) + raw_addr % (size * PAGE + 64) as u64;
    h.rdma_handle = handle;
    h.emit(&mut g);
    let mut copy = |bit: u16, r: std::ops::Range<usize>| {
        if fix & bit != 0 {
            f[r.clone()].copy_from_slice(&g[r]);
        }
    };
    copy(1 << 1, at::TYPE_VERSION);
    copy(1 << 3, at::DST_EP);
    copy(1 << 4, at::SRC_MAC);
    copy(1 << 4, at::SRC_EP);
    copy(1 << 4, at::SRC_VI);
    copy(1 << 5, at::DST_VI);
    copy(1 << 6, at::GENERATION);
    copy(1 << 7, at::PSN);
    copy(1 << 8, at::PAYLOAD_LEN);
    copy(1 << 9, at::MSG_LEN);
    copy(1 << 9, at::OFFSET);
    copy(1 << 9, at::MSG_SEQ);
    copy(1 << 10, at::RDMA_ADDR);
    copy(1 << 10, at::RDMA_HANDLE);
    copy(1 << 11, at::FLAGS);
    copy(1 << 12, at::ACK);
    if fix & 1 == 0 {
        f[at::DST_MAC].copy_from_slice(&g[at::DST_MAC]);
    }
    if fix & (1 << 2) != 0 {
        f[at::KIND] = KINDS[f[at::KIND] as usize % KINDS.len()] as u8;
    }
    if fix & (1 << 13) != 0 {
        let (head, rest) = f.split_at_mut(FRAME_HEADER_LEN);
        let n = (u16::from_be_bytes([head[68], head[69]]) as usize).min(rest.len());
        wire::seal(head, [&rest[..n]]);
    }
    f
}

/// Arena layout of the receive-path run, in [`page::BUFS`]: receive `k`
/// at `k * RECV_BYTES`, then the victim's send sources, then the
/// destinations of its RDMA reads.
const RECV_BYTES: usize = 512;
const SEND_SOURCES: usize = 4096;
const READ_DESTS: usize = 6144;

fn level(inp: &mut Input) -> Reliability {
    inp.pick(&LEVELS)
}

/// Arbitrary frames at a live VI amid genuine traffic both ways.
pub fn receive_path(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut rig = Rig::new(level(&mut inp));
    let reliable = rig.a.engine.core.vi(rig.a.vi).unwrap().reliable();
    for k in 0..4 {
        let at = k * RECV_BYTES;
        rig.a.post_recv(k, &[at..at + 200, at + 200..at + RECV_BYTES]);
        rig.b.post_recv(k, std::slice::from_ref(&(k * 1024..(k + 1) * 1024)));
    }
    let (mut b_sends, mut a_sends, mut a_recvs) = (0, 0, 4);
    for _ in 0..64 {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0..=3 => {
                let f = hostile_frame(&rig, &mut inp);
                rig.inject(&f);
                rig.step();
            }
            4 => rig.step(),
            5 if b_sends < 8 => {
                let n = inp.u16() as usize % 1025;
                let msg: Vec<u8> = (0..n).map(|i| i as u8 ^ 0x3c).collect();
                rig.b.post_send(4 + b_sends, 4096 + (b_sends % 4) * 1024, &msg, None);
                b_sends += 1;
            }
            6 if a_sends < 4 => {
                victim_sends(&mut rig, &mut inp, a_sends, reliable);
                a_sends += 1;
            }
            7 if a_recvs < 8 => {
                let at = a_recvs * RECV_BYTES;
                rig.a.post_recv(a_recvs, std::slice::from_ref(&(at..at + RECV_BYTES)));
                a_recvs += 1;
            }
            _ => {}
        }
    }
    for _ in 0..30 {
        rig.step();
    }
    if let Some(at) = rig.a.changed_outside(&[]) {
        panic!("the victim's byte {at:#x} changed: not memory a peer may write");
    }
    if let Some(at) = rig.b.changed_outside(&[]) {
        panic!("the peer's byte {at:#x} changed: not memory its peer may write");
    }
}

/// The victim posts a send, an RDMA write or (reliable VIs) an RDMA
/// read of the peer's window, in slot `8 + k`.
fn victim_sends(rig: &mut Rig, inp: &mut Input, k: usize, reliable: bool) {
    let (op, n, remote) = (inp.u8() % 3, inp.u16() as usize % 513, inp.u16() as u64 % (2 * PAGE as u64));
    let slot = 8 + k;
    let window = Seg { addr: rig.b.addr(page::WINDOW * PAGE) + remote, handle: rig.b.handles.window, len: 0 };
    let a = &mut rig.a;
    match op {
        0 => a.post_send(slot, SEND_SOURCES + k * 512, &vec![0xa7; n], None),
        1 => {
            let src = page::BUFS * PAGE + SEND_SOURCES + k * 512;
            a.write(src, &vec![0x7a; n]);
            let local = Seg { addr: a.addr(src), handle: a.handles.bufs, len: n as u32 };
            a.write_desc(slot, control::OP_RDMAWRITE, 0, n as u32, &[window, local]);
            a.post(slot, Queue::Send).expect("posting an RDMA write");
        }
        _ if reliable => {
            let dst = page::BUFS * PAGE + READ_DESTS + k * 512;
            let local = Seg { addr: a.addr(dst), handle: a.handles.bufs, len: n as u32 };
            a.write_desc(slot, control::OP_RDMAREAD, 0, n as u32, &[window, local]);
            a.post(slot, Queue::Send).expect("posting an RDMA read");
            a.writable.push(dst..dst + n);
        }
        _ => {}
    }
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
    if let Some(at) = rig.a.changed_outside(&[]) {
        panic!("the receiver's byte {at:#x} changed: the sender reached memory it may not");
    }
    // The sender's own descriptors may write anywhere its tag reaches (RDMA
    // reads scatter into its memory): only the foreign page and the guards stay.
    if let Some(at) = rig.b.changed_outside(std::slice::from_ref(&(page::DESCS * PAGE..page::FOREIGN * PAGE))) {
        panic!("the sender's byte {at:#x} changed: outside its protection tag");
    }
}
