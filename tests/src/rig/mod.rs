//! A deterministic rig for hostile-frame tests and the fuzz targets
//! (`fuzz/`): two engines on one in-process loopback wire, driven by hand
//! on one thread with a clock that only moves when [`Rig::step`] moves it.
//! VI `a.vi` (the victim) is connected to `b.vi` (its genuine peer); a raw
//! loopback device on the same wire injects frames. Each host's memory is
//! an [`Arena`] whose registration is known, and each host keeps the list
//! of byte ranges its peer may legitimately change ([`Host::writable`]),
//! so a test can check that nothing else changed.

pub mod arena;
pub mod input;
pub mod receive_path;
pub mod scenarios;

use arena::{page, pages, Arena, PAGE, SLOT_BYTES, SLOT_SEGMENTS};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use via_kernel_agent::memory::{MemAttributes, Ptag};
use via_wire::{flags, HeaderRepr, Kind, FRAME_HEADER_LEN};
use via_device::{FrameDevice, TxFrame};
use via_softnic::LoopbackDevice;
use via_user::descriptor::control;
use via_user::engine::post::Queue;
use via_user::engine::{Config, Engine};
use via_user::{Reliability, Time, ViAttributes};

/// How far one [`Rig::step`] moves the clock.
pub const STEP: Duration = Duration::from_micros(100);
/// MTU of the raw injector: it can send frames far larger than the hosts'.
pub const INJECTOR_MTU: usize = 1 << 17;
/// MaxTransferSize of the rig's VIs.
pub const MAX_TRANSFER: u32 = 1 << 16;

/// One segment of a descriptor as written to memory: a data segment, or
/// (first on an RDMA descriptor) the remote address segment, whose
/// `len` field is reserved.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seg {
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
}

/// Memory handles of a host's registered parts (see [`page`]).
#[derive(Clone, Copy, Debug)]
pub struct Handles {
    pub descs: u32,
    pub bufs: u32,
    pub window: u32,
    pub closed: u32,
    pub foreign: u32,
}

/// One engine with one VI and its arena. The engine is declared first,
/// so it is dropped before the memory it may reach.
pub struct Host {
    pub engine: Engine,
    pub vi: u16,
    pub ptag: Ptag,
    pub handles: Handles,
    pub arena: Arena,
    /// Arena ranges the peer may change: the RDMA window, the segments of
    /// posted receives and every descriptor's completion fields.
    pub writable: Vec<Range<usize>>,
    /// What the arena holds but for the engine's writes: the rig's own
    /// writes go to both.
    shadow: Vec<u8>,
}

/// The fill of arena byte `i` before the run: no two neighbours alike.
fn fill(i: usize) -> u8 {
    (i as u8).wrapping_mul(29) ^ (i >> 8) as u8 ^ 0x5a
}

impl Host {
    fn new(dev: LoopbackDevice, level: Reliability) -> Host {
        let config = Config { progress_thread: false, ..Config::default() };
        let mut engine = Engine::new(Box::new(dev), config).expect("engine on a loopback device");
        let ptag = engine.core.mem.create_ptag().unwrap();
        let other = engine.core.mem.create_ptag().unwrap();
        let arena = Arena::new();
        let shadow: Vec<u8> = (0..arena.len()).map(fill).collect();
        arena.write(0, &shadow);
        let mut reg = |first: usize, n: usize, ptag: Ptag, rdma: bool| {
            let attrs = MemAttributes { ptag, enable_rdma_write: rdma, enable_rdma_read: rdma };
            engine.register_memory(arena.addr(first * PAGE), n * PAGE, attrs).expect("registering rig memory")
        };
        let handles = Handles {
            descs: reg(page::DESCS, 1, ptag, false),
            bufs: reg(page::BUFS, 2, ptag, false),
            window: reg(page::WINDOW, 2, ptag, true),
            closed: reg(page::CLOSED, 1, ptag, false),
            foreign: reg(page::FOREIGN, 1, other, true),
        };
        let attrs = ViAttributes { reliability: level, max_transfer_size: MAX_TRANSFER, ptag, enable_rdma_write: true, enable_rdma_read: level.is_reliable() };
        let vi = engine.core.create_vi(attrs, None, None).expect("creating the rig's VI");
        let mut writable = vec![pages(page::WINDOW, 2)];
        writable.extend((0..arena::SLOTS).map(|s| slot_offset(s) + 20..slot_offset(s) + 32));
        Host { engine, vi, ptag, handles, arena, writable, shadow }
    }

    /// The address of arena offset `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.arena.addr(off) as u64
    }

    /// Copies `data` to arena offset `off` (the rig's own write).
    pub fn write(&mut self, off: usize, data: &[u8]) {
        self.arena.write(off, data);
        self.shadow[off..off + data.len()].copy_from_slice(data);
    }

    /// Writes a descriptor into slot `slot`.
    pub fn write_desc(&mut self, slot: usize, control: u16, imm: u32, length: u32, segs: &[Seg]) {
        assert!(segs.len() <= SLOT_SEGMENTS, "a slot holds {SLOT_SEGMENTS} segments");
        let mut d = vec![0u8; 32 + 16 * segs.len()];
        d[12..14].copy_from_slice(&(segs.len() as u16).to_ne_bytes());
        d[14..16].copy_from_slice(&control.to_ne_bytes());
        d[20..24].copy_from_slice(&imm.to_ne_bytes());
        d[24..28].copy_from_slice(&length.to_ne_bytes());
        for (i, s) in segs.iter().enumerate() {
            let o = 32 + 16 * i;
            d[o..o + 8].copy_from_slice(&s.addr.to_ne_bytes());
            d[o + 8..o + 12].copy_from_slice(&s.handle.to_ne_bytes());
            d[o + 12..o + 16].copy_from_slice(&s.len.to_ne_bytes());
        }
        self.write(slot_offset(slot), &d);
    }

    /// Posts the descriptor in slot `slot`.
    pub fn post(&mut self, slot: usize, q: Queue) -> via_user::Result<()> {
        let addr = self.arena.addr(slot_offset(slot));
        self.engine.core.post(self.vi, addr, self.handles.descs, q)
    }

    /// Posts a receive in slot `slot` scattering into the buffer pieces
    /// `pieces` (offsets in [`page::BUFS`]); the peer may write them.
    pub fn post_recv(&mut self, slot: usize, pieces: &[Range<usize>]) {
        let base = page::BUFS * PAGE;
        let segs: Vec<Seg> = pieces.iter().map(|p| Seg { addr: self.addr(base + p.start), handle: self.handles.bufs, len: p.len() as u32 }).collect();
        self.write_desc(slot, control::OP_SENDRECV, 0, 0, &segs);
        self.post(slot, Queue::Recv).expect("posting a receive");
        self.writable.extend(pieces.iter().map(|p| base + p.start..base + p.end));
    }

    /// Posts a send of `data`, copied to `at` in [`page::BUFS`], from slot `slot`.
    pub fn post_send(&mut self, slot: usize, at: usize, data: &[u8], imm: Option<u32>) {
        let base = page::BUFS * PAGE + at;
        self.write(base, data);
        let seg = Seg { addr: self.addr(base), handle: self.handles.bufs, len: data.len() as u32 };
        let ctl = if imm.is_some() { control::IMMEDIATE } else { 0 };
        self.write_desc(slot, ctl, imm.unwrap_or(0), data.len() as u32, &[seg]);
        self.post(slot, Queue::Send).expect("posting a send");
    }

    /// The completion of the descriptor in slot `slot`: status, length, immediate data.
    pub fn completion(&self, slot: usize) -> (u32, u32, u32) {
        let o = slot_offset(slot);
        let b = self.arena.read(o + 20..o + 32);
        let word = |at: usize| u32::from_ne_bytes(b[at - 20..at - 16].try_into().unwrap());
        (word(28), word(24), word(20))
    }

    /// The slot of the oldest completed descriptor of queue `q`, if any.
    pub fn done(&mut self, q: Queue) -> Option<usize> {
        let addr = self.engine.core.done(self.vi, q).expect("the rig's VI exists").1?;
        Some((addr - self.arena.addr(page::DESCS * PAGE)) / SLOT_BYTES)
    }

    /// Bytes `range` of [`page::BUFS`].
    pub fn buf(&self, range: Range<usize>) -> Vec<u8> {
        let base = page::BUFS * PAGE;
        self.arena.read(base + range.start..base + range.end)
    }

    /// What arena bytes `range` held before the engine wrote any: the
    /// fill, and the rig's own writes since.
    pub fn original(&self, range: Range<usize>) -> &[u8] {
        &self.shadow[range]
    }

    /// The first arena offset the engine changed outside
    /// [`Host::writable`] (and outside `also`).
    pub fn changed_outside(&self, also: &[Range<usize>]) -> Option<usize> {
        let allowed: Vec<Range<usize>> = self.writable.iter().chain(also).cloned().collect();
        arena::first_change(&self.shadow, &self.arena.snapshot(), &allowed)
    }
}

/// Arena offset of descriptor slot `slot`.
pub fn slot_offset(slot: usize) -> usize {
    page::DESCS * PAGE + slot * SLOT_BYTES
}

/// The two connected hosts and the injector.
pub struct Rig {
    pub a: Host,
    pub b: Host,
    pub raw: LoopbackDevice,
    /// The time both engines are driven at (each engine's clock begins
    /// on its own; the rig moves this one).
    pub now: Time,
}

static NEXT_WIRE: AtomicU32 = AtomicU32::new(0);

impl Rig {
    /// Connects a VI of `level` on a new wire to one on the other host.
    pub fn new(level: Reliability) -> Rig {
        let wire = format!("rig-{}-{}", std::process::id(), NEXT_WIRE.fetch_add(1, Ordering::Relaxed));
        let open = || LoopbackDevice::open(&wire).expect("a loopback device");
        let mut a = Host::new(open(), level);
        let mut b = Host::new(open(), level);
        let raw = LoopbackDevice::with_mtu(&wire, INJECTOR_MTU).expect("the injector");
        let now = a.engine.core.clock.now();
        let disc = b"rig";
        let wait = a.engine.core.connect_wait_begin(disc).unwrap();
        let amac = a.engine.core.mac;
        b.engine.core.connect_request_begin(b.vi, amac, disc, Instant::now() + Duration::from_secs(60)).unwrap();
        for _ in 0..1000 {
            b.engine.progress_at(now);
            a.engine.progress_at(now);
            if let Some(req) = a.engine.core.connect_wait_poll(wait) {
                a.engine.core.accept(req.conn, a.vi).expect("accepting the rig's connection");
            }
            if let Some(r) = b.engine.core.connect_request_poll(b.vi) {
                r.expect("connecting the rig's VIs");
                return Rig { a, b, raw, now };
            }
        }
        panic!("the rig's VIs did not connect in 1000 rounds");
    }

    /// Moves the clock one [`STEP`] and runs a round of progress on the
    /// victim, then on the peer; what reached the injector is discarded.
    pub fn step(&mut self) {
        self.now += STEP;
        self.a.engine.progress_at(self.now);
        self.b.engine.progress_at(self.now);
        while self.raw.receive(64, &mut |_| {}).unwrap_or(0) > 0 {}
    }

    /// Steps until `done` holds, at most `max` times; says whether it held.
    pub fn step_until(&mut self, max: usize, mut done: impl FnMut(&mut Rig) -> bool) -> bool {
        for _ in 0..max {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Sends `frame` from the injector as it is; false when the wire
    /// refused it (shorter than an Ethernet header).
    pub fn inject(&mut self, frame: &[u8]) -> bool {
        self.raw.transmit(&[TxFrame::new(frame)]).is_ok()
    }

    /// The header of a one-fragment message from the peer's VI to the
    /// victim's, next in sequence, with `payload_len` bytes: what the peer
    /// would send. Tests spoil one field of it.
    pub fn genuine(&self, payload_len: usize) -> HeaderRepr {
        let core = &self.a.engine.core;
        let vi = core.vi(self.a.vi).expect("the victim VI");
        let peer = vi.peer.as_ref().expect("the victim is connected");
        let reliable = if vi.reliable() { flags::RELIABLE } else { 0 };
        HeaderRepr {
            dst_mac: core.mac,
            src_mac: peer.mac,
            kind: Kind::Data as u8,
            flags: flags::FIRST | flags::LAST | reliable,
            dst_ep: core.ep,
            src_ep: peer.ep,
            dst_vi: self.a.vi,
            src_vi: peer.vi,
            generation: peer.generation,
            psn: vi.rx.expected,
            msg_len: payload_len as u32,
            payload_len: payload_len as u16,
            msg_seq: vi.rx.msg.as_ref().map_or(0, |m| m.msg_seq),
            ..HeaderRepr::default()
        }
    }
}

/// The bytes of a frame with header `h` and `payload`.
pub fn frame_bytes(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    h.emit(&mut head);
    let mut f = head.to_vec();
    f.extend_from_slice(payload);
    f
}
