//! The receive-path scenario ([`receive_path`], the `receive_path` fuzz
//! target's body) and its oracle: arbitrary frames at a live, connected
//! VI while genuine traffic flows both ways on that connection.
//!
//! The input decides the level of reliability, then up to 64 operations:
//!
//! - a *foreign* frame: any bytes, with the header fields a 16-bit mask
//!   selects set to what the genuine peer would send, but never the
//!   connection's identity in full (a frame whose source host, endpoint,
//!   VI and generation are one side's peer is moved to the previous
//!   generation, see [`disown`]). No such frame may have any effect on
//!   the connection.
//! - a *violation* (reliable VIs only): a frame with the peer's identity
//!   in every respect, an RDMA write outside what the victim opened to
//!   RDMA. Only these may break the connection, and then the victim must
//!   report `RdmaWriteProt` (and the peer learn that the connection is
//!   lost); a violation that arrives out of sequence is dropped instead.
//! - genuine traffic: the peer sends a message (bytes [`to_victim_byte`]);
//!   the victim sends one ([`to_peer_byte`]), RDMA-writes the first page
//!   of the peer's window ([`write_byte`]) or RDMA-reads its second page;
//!   the victim posts another receive. Each side only sends what the
//!   other has a receive posted for, so genuine traffic alone never fails.
//!
//! The oracle, once every posted send has completed: every genuine
//! message arrived exactly once, in order, intact, in the receive posted
//! for it, and nothing else completed; each completed receive holds the
//! message's bytes and, past them, what it held before (no byte of a
//! hostile frame ever lands in a receive, completed or not); receives
//! nothing arrived for, the victim's RDMA window and every other byte of
//! both hosts' memory are untouched (but for completion words); RDMA
//! reads brought the peer's bytes; both VIs are still connected with no
//! error reported, unless a violation broke them as said above (then the
//! genuine messages that completed are a prefix, intact, and the rest
//! are flushed, their buffers holding genuine bytes or their old ones).

use super::arena::{page, pages, PAGE};
use super::input::Input;
use super::{frame_bytes, Host, Rig, Seg};
use via_wire::{self as wire, Frame, Kind, FRAME_HEADER_LEN};
use via_user::descriptor::{control, status};
use via_user::engine::post::Queue;
use via_user::{AsyncErrorKind, Reliability, ViPhase};

const LEVELS: [Reliability; 3] = [Reliability::Unreliable, Reliability::ReliableDelivery, Reliability::ReliableReception];

/// The victim's layout, in its [`page::BUFS`]: receive `j` (descriptor
/// slot `j`) at `j * RECV_BYTES`, two segments split at `FIRST_SEGMENT`.
const RECV_BYTES: usize = 512;
const FIRST_SEGMENT: usize = 200;
const RECVS: usize = 8;
const RECVS_AT_START: usize = 4;
/// Where the victim's operation `k` (descriptor slot `8 + k`) takes its
/// bytes from (`+ k * 512`), and where its RDMA reads put theirs.
const SEND_SOURCES: usize = 4096;
const READ_DESTS: usize = 6144;
const VICTIM_OPS: usize = 4;
/// Largest message or RDMA transfer of the genuine traffic.
const MAX_GENUINE: usize = 512;
/// The peer's layout: receive `k` (slot `k`) at `k * PEER_RECV_BYTES`,
/// send `k` (slot `4 + k`) from `4096 + k * 512`.
const PEER_RECV_BYTES: usize = 1024;
const PEER_RECVS: usize = 4;
const PEER_SENDS: usize = 8;
/// Steps the run may take to settle after its operations.
const SETTLE_STEPS: usize = 5000;

/// Byte `i` of genuine message `k` from the peer to the victim.
pub fn to_victim_byte(k: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(7) ^ ((i >> 8) as u8).wrapping_mul(0x55) ^ (k as u8).wrapping_mul(0x35) ^ 0x3c
}

/// Byte `i` of genuine message `k` from the victim to the peer.
pub fn to_peer_byte(k: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(11) ^ ((i >> 8) as u8).wrapping_mul(0x33) ^ (k as u8).wrapping_mul(0x49) ^ 0xa7
}

/// Byte `i` of the victim's RDMA write `k`.
pub fn write_byte(k: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(13) ^ ((i >> 8) as u8).wrapping_mul(0x21) ^ (k as u8).wrapping_mul(0x6b) ^ 0x7a
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

const KINDS: [Kind; 17] = [
    Kind::Data,
    Kind::Ack,
    Kind::RdmaWrite,
    Kind::RdmaReadReq,
    Kind::RdmaReadResp,
    Kind::AtomicReq,
    Kind::AtomicResp,
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

/// A foreign frame from the input: its bytes as given, then the fields
/// that the 16 bits of `fix` select set to what the genuine peer would
/// send (bit 0 clear: the victim's MAC; 1 type and version; 2 a known
/// kind; 3 destination endpoint; 4 source MAC; 5 destination VI; 6
/// generation; 7 PSN; 8 payload length; 9 message fields; 10 RDMA
/// target; 11 flags; 12 ACK; 13 sealed; 14 source endpoint; 15 source
/// VI), then [`disown`]ed.
fn foreign_frame(rig: &Rig, inp: &mut Input) -> Vec<u8> {
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
    if let Some(m) = vi.rx.msg.as_ref() {
        (h.msg_seq, h.msg_len, h.offset) = (m.msg_seq, m.msg_len, m.got);
    }
    let span = vi.tx.sent_hi.wrapping_sub(vi.tx.una).wrapping_add(1).max(1);
    h.ack = vi.tx.una.wrapping_add(u32::from_be_bytes(f[at::ACK].try_into().unwrap()) % span);
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
    copy(1 << 14, at::SRC_EP);
    copy(1 << 15, at::SRC_VI);
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
        seal(&mut f);
    }
    disown(rig, &mut f);
    f
}

/// Seals frame `f` over the payload its header claims (or what there is).
fn seal(f: &mut [u8]) {
    let (head, rest) = f.split_at_mut(FRAME_HEADER_LEN);
    let n = (u16::from_be_bytes([head[at::PAYLOAD_LEN.start], head[at::PAYLOAD_LEN.start + 1]]) as usize).min(rest.len());
    wire::seal(head, [&rest[..n]]);
}

/// Makes sure frame `f` is not the connection's own: if it parses and its
/// source host, endpoint, VI and generation are those of either side's
/// peer, it becomes a frame of the generation before (sealed again if it
/// was sealed), which both engines must drop as stale. A frame with the
/// connection's identity in full is what the peer sends; no receiver can
/// tell a copy from it, and violations of that kind are made on purpose
/// by [`peer_violation`].
fn disown(rig: &Rig, f: &mut [u8]) {
    let Ok(frame) = Frame::new_checked(&f[..]) else { return };
    let (mac, ep, vi, generation) = (frame.src_mac(), frame.src_ep(), frame.src_vi(), frame.generation());
    let sealed = frame.checksum_ok();
    let peer = |h: &Host| h.engine.core.vi(h.vi).ok().and_then(|v| v.peer.clone());
    let theirs = [&rig.a, &rig.b].into_iter().filter_map(peer).any(|p| p.mac == mac && p.ep == ep && p.vi == vi && p.generation == generation);
    if theirs {
        f[at::GENERATION.end - 1] ^= 1;
        if sealed {
            seal(f);
        }
    }
}

/// Fill of the payload of a violation: in no genuine pattern's place.
const HOSTILE: u8 = 0xEE;

/// A frame with the peer's identity in every respect (what the peer, or
/// someone who learnt the connection's generation, can send) that is an
/// RDMA write outside what the victim opened to RDMA: running past the
/// end of its window, to memory with RDMA off, under another protection
/// tag, or with the window's handle at a guard page. Its PSN is the next
/// expected or up to two past it.
fn peer_violation(rig: &Rig, inp: &mut Input) -> Vec<u8> {
    let (target, off, ahead, n) = (inp.u8() % 4, inp.u16() as usize, inp.u8() % 3, 1 + inp.u16() as usize % 256);
    let a = &rig.a;
    let mut h = rig.genuine(n);
    h.kind = Kind::RdmaWrite as u8;
    h.psn = h.psn.wrapping_add(u32::from(ahead));
    (h.rdma_handle, h.rdma_addr) = match target {
        0 => (a.handles.window, a.addr(pages(page::WINDOW, 2).end - off % n)),
        1 => (a.handles.closed, a.addr(page::CLOSED * PAGE + off % (PAGE - n))),
        2 => (a.handles.foreign, a.addr(page::FOREIGN * PAGE + off % (PAGE - n))),
        _ => (a.handles.window, a.addr(page::GUARD_HI * PAGE + off % (PAGE - n))),
    };
    frame_bytes(&h, &vec![HOSTILE; n])
}

/// What the victim posted on its send queue.
#[derive(Clone, Copy, Debug)]
enum VictimOp {
    /// A send (its message is in `Run::to_peer`).
    Send,
    /// RDMA write `k` of `len` bytes at offset `at` of the peer's window.
    Write { k: usize, at: usize, len: usize },
    /// RDMA read of `len` bytes at offset `at` of the peer's window into
    /// arena offset `dst` of the victim.
    Read { at: usize, dst: usize, len: usize },
}

/// A completion: descriptor slot, status, length.
type Completion = (usize, u32, u32);

/// The run: the rig and what was posted and completed.
struct Run {
    rig: Rig,
    /// Lengths of the peer's messages to the victim, in order.
    to_victim: Vec<usize>,
    /// Lengths of the victim's messages to the peer, in order.
    to_peer: Vec<usize>,
    victim_ops: Vec<VictimOp>,
    victim_recvs_posted: usize,
    /// Violations injected.
    violations: usize,
    victim_recvs: Vec<Completion>,
    victim_sends: Vec<Completion>,
    peer_recvs: Vec<Completion>,
    peer_sends: Vec<Completion>,
}

fn drain(h: &mut Host, q: Queue, into: &mut Vec<Completion>) {
    while let Some(slot) = h.done(q) {
        let (st, len, _) = h.completion(slot);
        into.push((slot, st, len));
    }
}

impl Run {
    /// One step of the rig; collects what completed on either side.
    fn step(&mut self) {
        self.rig.step();
        drain(&mut self.rig.a, Queue::Recv, &mut self.victim_recvs);
        drain(&mut self.rig.a, Queue::Send, &mut self.victim_sends);
        drain(&mut self.rig.b, Queue::Recv, &mut self.peer_recvs);
        drain(&mut self.rig.b, Queue::Send, &mut self.peer_sends);
    }

    fn victim_connected(&self) -> bool {
        self.rig.a.engine.core.vi(self.rig.a.vi).is_ok_and(|v| v.phase == ViPhase::Connected)
    }

    fn post_victim_recv(&mut self) {
        let j = self.victim_recvs_posted;
        let at = j * RECV_BYTES;
        self.rig.a.post_recv(j, &[at..at + FIRST_SEGMENT, at + FIRST_SEGMENT..at + RECV_BYTES]);
        self.victim_recvs_posted += 1;
    }

    fn peer_sends(&mut self, len: usize) {
        let k = self.to_victim.len();
        let msg: Vec<u8> = (0..len).map(|i| to_victim_byte(k, i)).collect();
        self.rig.b.post_send(4 + k, 4096 + k * 512, &msg, None);
        self.to_victim.push(len);
    }

    /// The victim posts a send, an RDMA write or (reliable VIs) an RDMA
    /// read of the peer's window, in slot `8 + k`.
    fn victim_op(&mut self, inp: &mut Input, reliable: bool) {
        let (choice, len, remote) = (inp.u8() % 3, inp.u16() as usize % (MAX_GENUINE + 1), inp.u16() as usize % (PAGE - MAX_GENUINE));
        let k = self.victim_ops.len();
        let slot = 8 + k;
        let src = page::BUFS * PAGE + SEND_SOURCES + k * 512;
        let window = |b: &Host, at: usize| Seg { addr: b.addr(page::WINDOW * PAGE + at), handle: b.handles.window, len: 0 };
        let op = match choice {
            1 => {
                let k = self.victim_ops.iter().filter(|o| matches!(o, VictimOp::Write { .. })).count();
                let data: Vec<u8> = (0..len).map(|i| write_byte(k, i)).collect();
                let remote = window(&self.rig.b, remote);
                let a = &mut self.rig.a;
                a.write(src, &data);
                let local = Seg { addr: a.addr(src), handle: a.handles.bufs, len: len as u32 };
                a.write_desc(slot, control::OP_RDMAWRITE, 0, len as u32, &[remote, local]);
                a.post(slot, Queue::Send).expect("posting an RDMA write");
                VictimOp::Write { k, at: remote_offset(remote.addr, &self.rig.b), len }
            }
            2 if reliable => {
                // The second page of the window: nothing writes it.
                let remote = window(&self.rig.b, PAGE + remote);
                let a = &mut self.rig.a;
                let dst = page::BUFS * PAGE + READ_DESTS + k * 512;
                let local = Seg { addr: a.addr(dst), handle: a.handles.bufs, len: len as u32 };
                a.write_desc(slot, control::OP_RDMAREAD, 0, len as u32, &[remote, local]);
                a.post(slot, Queue::Send).expect("posting an RDMA read");
                a.writable.push(dst..dst + len);
                VictimOp::Read { at: remote_offset(remote.addr, &self.rig.b), dst, len }
            }
            _ => {
                let k = self.to_peer.len();
                let msg: Vec<u8> = (0..len).map(|i| to_peer_byte(k, i)).collect();
                self.rig.a.post_send(slot, SEND_SOURCES + self.victim_ops.len() * 512, &msg, None);
                self.to_peer.push(len);
                VictimOp::Send
            }
        };
        self.victim_ops.push(op);
    }

    /// Whether every posted send completed on both sides and every
    /// message sent has a receive completion.
    fn settled(&self) -> bool {
        self.victim_sends.len() == self.victim_ops.len()
            && self.peer_sends.len() == self.to_victim.len()
            && self.victim_recvs.len() >= self.to_victim.len()
            && self.peer_recvs.len() >= self.to_peer.len()
    }
}

/// Window offset of address `addr` of the peer's memory.
fn remote_offset(addr: u64, b: &Host) -> usize {
    (addr - b.addr(page::WINDOW * PAGE)) as usize
}

/// Arbitrary frames at a live VI amid genuine traffic both ways; see the
/// module's documentation for what is checked.
pub fn receive_path(data: &[u8]) {
    run_receive_path(data);
}

/// What a [`receive_path`] run came to (for the seed tests, to see that
/// each seed still does what it was made for).
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    /// A violation broke the connection.
    pub broken: bool,
    /// Genuine messages delivered intact to the victim, and to the peer.
    pub to_victim: usize,
    pub to_peer: usize,
    /// Foreign frames the victim dropped as another connection's.
    pub rx_stale: u64,
    pub rdma_prot_errors: u64,
}

/// [`receive_path`], returning what the run came to.
pub fn run_receive_path(data: &[u8]) -> Summary {
    let mut inp = Input::new(data);
    let level = inp.pick(&LEVELS);
    let mut rig = Rig::new(level);
    // Nothing of the genuine traffic RDMA-writes the victim.
    let window = pages(page::WINDOW, 2);
    rig.a.writable.retain(|r| *r != window);
    let mut run = Run {
        rig,
        to_victim: Vec::new(),
        to_peer: Vec::new(),
        victim_ops: Vec::new(),
        victim_recvs_posted: 0,
        violations: 0,
        victim_recvs: Vec::new(),
        victim_sends: Vec::new(),
        peer_recvs: Vec::new(),
        peer_sends: Vec::new(),
    };
    let reliable = level.is_reliable();
    for _ in 0..RECVS_AT_START {
        run.post_victim_recv();
    }
    for k in 0..PEER_RECVS {
        run.rig.b.post_recv(k, std::slice::from_ref(&(k * PEER_RECV_BYTES..(k + 1) * PEER_RECV_BYTES)));
    }
    for _ in 0..64 {
        if inp.is_empty() || !run.victim_connected() {
            break;
        }
        match inp.u8() % 10 {
            0..=3 => {
                let f = foreign_frame(&run.rig, &mut inp);
                run.rig.inject(&f);
                run.step();
            }
            5 => {
                let len = inp.u16() as usize % (MAX_GENUINE + 1);
                if run.to_victim.len() < PEER_SENDS.min(run.victim_recvs_posted) {
                    run.peer_sends(len);
                }
            }
            6 if run.victim_ops.len() < VICTIM_OPS => run.victim_op(&mut inp, reliable),
            7 if run.victim_recvs_posted < RECVS => run.post_victim_recv(),
            8 => {
                let f = peer_violation(&run.rig, &mut inp);
                if reliable {
                    run.rig.inject(&f);
                    run.violations += 1;
                }
                run.step();
            }
            _ => run.step(),
        }
    }
    for _ in 0..SETTLE_STEPS {
        if run.settled() {
            break;
        }
        run.step();
    }
    assert!(
        run.settled(),
        "after {SETTLE_STEPS} steps, still missing (a genuine message lost, or a connection dead): victim {:?}; \
         of its {} operations {:?} completed {:?}; of {} messages to it, receives completed {:?}; \
         the peer {:?}: of its {} sends completed {:?}; of {} messages to it, receives completed {:?}",
        run.rig.a.engine.core.vi(run.rig.a.vi).map(|v| v.phase),
        run.victim_ops.len(),
        run.victim_ops,
        run.victim_sends,
        run.to_victim.len(),
        run.victim_recvs,
        run.rig.b.engine.core.vi(run.rig.b.vi).map(|v| v.phase),
        run.to_victim.len(),
        run.peer_sends,
        run.to_peer.len(),
        run.peer_recvs
    );
    // Late writes, had there been any, land now.
    for _ in 0..20 {
        run.step();
    }
    check(&run);
    let ok = |c: &[Completion]| c.iter().filter(|c| c.1 & status::ERROR_MASK == 0).count();
    let counters = &run.rig.a.engine.core.counters;
    Summary {
        broken: !run.victim_connected(),
        to_victim: ok(&run.victim_recvs),
        to_peer: ok(&run.peer_recvs),
        rx_stale: counters.rx_stale,
        rdma_prot_errors: counters.rdma_prot_errors,
    }
}

/// The oracle over a settled run.
fn check(run: &Run) {
    let (a, b) = (&run.rig.a, &run.rig.b);
    let phase = |h: &Host| h.engine.core.vi(h.vi).expect("the rig's VI").phase;
    let broken = phase(a) != ViPhase::Connected;
    let (a_errors, b_errors) = (&a.engine.core.async_errors, &b.engine.core.async_errors);
    if broken {
        assert!(run.violations > 0, "the connection broke ({:?}, victim errors {a_errors:?}, peer errors {b_errors:?}) though every frame injected was foreign", phase(a));
        assert_eq!(phase(a), ViPhase::Error);
        assert!(!a_errors.is_empty() && a_errors.iter().all(|e| e.kind == AsyncErrorKind::RdmaWriteProt), "a violation broke the connection: the victim reports it as such, not {a_errors:?}");
        assert!(a.engine.core.counters.rdma_prot_errors >= 1, "the victim counts the violation");
        assert_eq!(phase(b), ViPhase::Error, "the peer learns that the victim broke the connection");
        assert!(b_errors.iter().all(|e| e.kind == AsyncErrorKind::ConnLost), "the peer: {b_errors:?}");
    } else {
        assert!(a_errors.is_empty(), "the victim reported {a_errors:?}");
        assert!(b_errors.is_empty(), "the peer reported {b_errors:?}");
        assert_eq!(phase(b), ViPhase::Connected, "the peer's VI");
        assert_eq!(a.engine.core.counters.connections_lost + b.engine.core.counters.connections_lost, 0, "connections lost");
        assert_eq!(a.engine.core.counters.rdma_prot_errors, 0, "an RDMA protection error counted on a connection still up");
    }
    let bufs = page::BUFS * PAGE;
    check_receives(a, "victim", &run.victim_recvs, run.victim_recvs_posted, &run.to_victim, broken, |j| bufs + j * RECV_BYTES..bufs + (j + 1) * RECV_BYTES, to_victim_byte);
    check_receives(b, "peer", &run.peer_recvs, PEER_RECVS, &run.to_peer, broken, |j| bufs + j * PEER_RECV_BYTES..bufs + (j + 1) * PEER_RECV_BYTES, to_peer_byte);
    // The victim's operations, in the order posted.
    let mut flushed = false;
    for (k, (op, &(slot, st, _))) in run.victim_ops.iter().zip(&run.victim_sends).enumerate() {
        assert_eq!(slot, 8 + k, "the victim's sends complete in order");
        if st & status::ERROR_MASK != 0 {
            assert!(broken, "victim op {k} ({op:?}) completed {st:#x} on a connection still up");
            flushed = true;
        } else {
            assert!(!flushed, "victim op {k} ({op:?}) completed after one that failed");
        }
        if let VictimOp::Read { at, dst, len } = *op {
            let want = b.original(page::WINDOW * PAGE + at..page::WINDOW * PAGE + at + len);
            let got = a.arena.read(dst..dst + len);
            let old = a.original(dst..dst + len);
            for i in 0..len {
                let ok = got[i] == want[i] || (st & status::ERROR_MASK != 0 && got[i] == old[i]);
                assert!(ok, "victim op {k} ({op:?}) status {st:#x}: byte {i} is {:#04x}, not the peer's {:#04x}", got[i], want[i]);
            }
        }
    }
    assert_eq!(run.peer_sends.len(), run.to_victim.len());
    for (k, &(slot, st, _)) in run.peer_sends.iter().enumerate() {
        assert_eq!(slot, 4 + k, "the peer's sends complete in order");
        assert!(broken || st & status::ERROR_MASK == 0, "the peer's send {k} completed {st:#x} on a connection still up");
    }
    // The peer's window: its first page holds the victim's RDMA writes
    // in order over what was there (any of them, where they overlap, once
    // the connection broke), its second page what it held.
    let win = page::WINDOW * PAGE;
    let old = b.original(win..win + 2 * PAGE);
    let got = b.arena.read(win..win + 2 * PAGE);
    let mut want = old.to_vec();
    let writes: Vec<(usize, usize, usize)> = run.victim_ops.iter().filter_map(|o| if let VictimOp::Write { k, at, len } = *o { Some((k, at, len)) } else { None }).collect();
    for &(k, at, len) in &writes {
        for i in 0..len {
            want[at + i] = write_byte(k, i);
        }
    }
    for i in 0..2 * PAGE {
        let ok = got[i] == want[i] || broken && (got[i] == old[i] || writes.iter().any(|&(k, at, len)| (at..at + len).contains(&i) && got[i] == write_byte(k, i - at)));
        assert!(ok, "the peer's window byte {i:#x} is {:#04x}, not {:#04x}", got[i], want[i]);
    }
    if let Some(at) = a.changed_outside(&[]) {
        panic!("the victim's byte {at:#x} changed: not memory its peer may write");
    }
    if let Some(at) = b.changed_outside(&[]) {
        panic!("the peer's byte {at:#x} changed: not memory its peer may write");
    }
}

/// Receives posted on `h` in slots `0..posted` (buffer of slot `j` at
/// arena `buf(j)`), completed as `done`, against the genuine messages
/// of lengths `sent` (byte `i` of message `k`: `byte(k, i)`).
#[allow(clippy::too_many_arguments)]
fn check_receives(h: &Host, who: &str, done: &[Completion], posted: usize, sent: &[usize], broken: bool, buf: impl Fn(usize) -> std::ops::Range<usize>, byte: fn(usize, usize) -> u8) {
    let mut failed = false;
    let mut delivered = 0;
    for (j, &(slot, st, len)) in done.iter().enumerate() {
        assert_eq!(slot, j, "{who}: receives complete in the order posted");
        let (got, old) = (h.arena.read(buf(j)), h.original(buf(j)));
        if st & status::ERROR_MASK == 0 {
            assert!(!failed, "{who}: receive {j} completed after one that failed");
            let Some(&want_len) = sent.get(j) else {
                panic!("{who}: receive {j} completed ({st:#x}, {len} bytes) with no genuine message sent for it: {:02x?}", &got[..(len as usize).min(got.len())]);
            };
            assert_eq!(len as usize, want_len, "{who}: receive {j} holds {len} bytes, genuine message {j} has {want_len}");
            for i in 0..got.len() {
                let want = if i < want_len { byte(j, i) } else { old[i] };
                assert_eq!(got[i], want, "{who}: receive {j} (genuine message {j}, {want_len} bytes), byte {i}: not the genuine message's{}", if i < want_len { "" } else { " end: untouched" });
            }
            delivered += 1;
        } else {
            assert!(broken, "{who}: receive {j} completed {st:#x} on a connection still up");
            assert!(st & status::DESC_FLUSHED_ERROR != 0 && len == 0, "{who}: receive {j} completed {st:#x} with {len} bytes once the connection broke");
            failed = true;
            check_partial(who, j, &got, old, sent.get(j).copied().unwrap_or(0), byte);
        }
    }
    if !broken {
        assert_eq!(delivered, sent.len(), "{who}: of {} genuine messages, {delivered} arrived", sent.len());
    }
    // Receives that nothing completed: untouched, or (once the connection
    // broke, before they were flushed) a genuine message's start.
    for j in done.len()..posted {
        let (got, old) = (h.arena.read(buf(j)), h.original(buf(j)));
        let len = if broken { sent.get(j).copied().unwrap_or(0) } else { 0 };
        check_partial(who, j, &got, old, len, byte);
    }
}

/// Each byte of receive `j`'s buffer `got` is what it held (`old`) or,
/// in its first `len`, genuine message `j`'s.
fn check_partial(who: &str, j: usize, got: &[u8], old: &[u8], len: usize, byte: fn(usize, usize) -> u8) {
    for i in 0..got.len() {
        assert!(got[i] == old[i] || i < len && got[i] == byte(j, i), "{who}: receive {j}, byte {i} is {:#04x}: neither what it held nor genuine message {j}'s", got[i]);
    }
}
