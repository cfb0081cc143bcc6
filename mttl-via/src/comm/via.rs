//! The eight primitives over VIA, as MTTL.md describes: one Reliable
//! Delivery VI per peer, all of them completing into one completion queue;
//! receives in fixed slots of one pool per rank (a shared receive queue,
//! the `vipl_ext.h` extension) that every VI draws from, each posted again
//! as soon as it is consumed, so that receive memory does not grow with
//! the number of peers; credit flow control ([`Credits`]) gives each peer
//! a window of messages in flight. The windows of all peers may add up to
//! more than the pool: a message that finds the pool empty is refused
//! (receiver-not-ready mode, which the layer turns on) and sent again by
//! its sender after a back-off, never lost and never breaking the VI;
//! `brecany` takes the head of the pending-VI list ([`PendingList`]) or
//! waits on the CQ; `brecnode` and `prob` append the completions of other
//! VIs they meet to the list's tail.
//!
//! Frames: each slot-sized frame has an 8-byte header `[credit report u32
//! LE][kind u8][0; 3]`. Small messages queued in a row to one peer travel
//! together in one PACKED frame (`[len u32 LE][bytes]` each), which the
//! receiver hands out one by one; a larger message goes in MORE fragments
//! and a LAST one; CREDIT frames carry a report and nothing else, and are
//! absorbed as they arrive (they take no credit). The kind byte of a slot is zeroed before it is posted, so a
//! completion whose slot still says 0 is an RDMA write with immediate
//! data (a [`Bulk::put`] into our heap), which reaches the program as
//! `[BULK_NOTICE, imm]`.
//!
//! The heap is one registered region with RDMA write enabled; start-up
//! exchanges each rank's MAC address and heap buffer through the boot
//! rendezvous.

use super::credit::Credits;
use super::pending::PendingList;
use super::{AtomicOp, Bulk, CommError, Result, SendHandle, Transport, BULK_NOTICE};
use crate::boot::Boot;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};
use via_user::{Completion, Cq, Descriptor, MacAddr, MemAttributes, MemoryRegion, Nic, Op, Ptag, Reliability, RemoteBuffer, Srq, Vi, ViAttributes};

mod connect;

/// Bytes of one receive or send slot (`MTTL_VIA_SLOT`): a message up to
/// this size is one VIA send, larger ones go in slot-sized fragments.
/// Fewer, larger fragments cost fewer descriptors, completions and
/// credits per byte: 32 KiB, or 64 KiB on a device whose frames carry
/// more than 32 KiB (a 56 KB collective step is then one send in one
/// frame; on a 9000-byte MTU the larger slot measured no better).
const SLOT_DEFAULT: usize = 32 << 10;
const SLOT_JUMBO: usize = 64 << 10;
/// Messages each peer may have in flight to us (its credit window,
/// `MTTL_VIA_RECVS`): at most this many, fewer when many peers would make
/// their windows exceed [`RECV_BUDGET`], never fewer than [`RECVS_MIN`].
const RECVS_MAX: usize = 32;
const RECVS_MIN: usize = 8;
/// Bytes of the windows of all peers the default aims at.
const RECV_BUDGET: usize = 16 << 20;
/// Receive slots in the pool (`MTTL_VIA_POOL`): the peers' windows in
/// all, but at most this many, whatever the number of ranks.
const POOL_MAX: usize = 128;
/// Frames held in the pool are copied out when fewer than 1/SPILL_BELOW
/// of its slots are left and a wait needs others ([`ViaTransport::spill`]).
const SPILL_BELOW: usize = 2;
/// Send slots shared by all peers.
const SEND_SLOTS: usize = 256;
const HDR: usize = 8;

mod frame {
    pub const MORE: u8 = 1;
    pub const LAST: u8 = 2;
    pub const CREDIT: u8 = 3;
    /// Whole small messages, each `[len u32 LE][bytes]`.
    pub const PACKED: u8 = 4;
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn err(what: impl std::fmt::Display) -> CommError {
    CommError(format!("via: {what}"))
}

enum Out {
    Msg { bytes: Vec<u8>, at: usize, seq: u64 },
    /// A message copied straight into send slots when it was queued, one
    /// `(slot, payload bytes)` per fragment; the frame headers are written
    /// when each is posted (they carry the credit report of that moment).
    Staged { frags: VecDeque<(usize, usize)>, seq: u64 },
    /// An RDMA write of our heap at `src` to the peer's at `dst`; its last
    /// piece carries `imm` and takes a receive of the peer's (a credit).
    Put { xfer: HeapTransfer, imm: u32 },
    /// An RDMA read of the peer's heap at `src` into ours at `dst`: it
    /// takes no receive of the peer's, so no credit.
    Get { xfer: HeapTransfer },
    /// A remote atomic on the peer's word at `dst`, the value before into
    /// our heap at `result`; no credit either.
    Atomic { dst: usize, result: usize, op: AtomicOp, seq: u64 },
}

/// What is left of an RDMA transfer between our heap and a peer's, cut
/// into pieces of at most the VI's largest transfer as it is posted.
struct HeapTransfer {
    src: usize,
    dst: usize,
    len: usize,
    seq: u64,
}

/// One posted piece of a [`HeapTransfer`].
struct Piece {
    src: usize,
    dst: usize,
    len: usize,
    last: bool,
}

impl HeapTransfer {
    /// Whether the next piece (at most `max` bytes) is the last.
    fn next_is_last(&self, max: usize) -> bool {
        self.len <= max
    }

    /// Cuts the next piece of at most `max` bytes off the front.
    fn cut(&mut self, max: usize) -> Piece {
        let len = self.len.min(max);
        let piece = Piece { src: self.src, dst: self.dst, len, last: len == self.len };
        self.src += len;
        self.dst += len;
        self.len -= len;
        piece
    }
}

/// Where a completed receive's frame is: in its pool slot, or copied out
/// so that the slot could go back to the pool ([`ViaTransport::spill`]).
enum Held {
    Slot(usize),
    Copy(Vec<u8>),
}

/// A received frame's bytes, wherever they are held; offsets from the
/// frame's start.
enum FrameBytes<'a> {
    /// In the receive region, from this offset.
    Slot(&'a MemoryRegion, usize),
    Copy(&'a [u8]),
}

impl FrameBytes<'_> {
    fn read(&self, off: usize, out: &mut [u8]) -> Result<()> {
        match *self {
            FrameBytes::Slot(mem, base) => mem.read(base + off, out).map_err(err),
            FrameBytes::Copy(c) => c.get(off..off + out.len()).map(|b| out.copy_from_slice(b)).ok_or_else(|| err("a read past a copied frame")),
        }
    }

    fn append_to(&self, r: Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        match *self {
            FrameBytes::Slot(mem, base) => mem.append_to(base + r.start..base + r.end, out).map_err(err),
            FrameBytes::Copy(c) => c.get(r).map(|b| out.extend_from_slice(b)).ok_or_else(|| err("a range past a copied frame")),
        }
    }
}

/// A send posted and not yet completed.
struct Posted {
    slot: Option<usize>,
    /// Set on the last transfer of a message or put.
    seq: Option<u64>,
}

struct Peer {
    vi: Vi,
    credits: Credits,
    partial: Vec<u8>,
    /// Messages of a PACKED frame not handed out yet (each has its entry
    /// on the pending list).
    unpacked: VecDeque<Vec<u8>>,
    /// Receives completed (seen on the CQ) and not consumed yet, with
    /// where their frames are, in the VI's order.
    arrived: VecDeque<(Descriptor, Held)>,
    backlog: VecDeque<Out>,
    posted: VecDeque<Posted>,
    /// Messages and puts queued in all; those whose last transfer completed.
    queued: u64,
    completed: u64,
    heap: RemoteBuffer,
    closed: bool,
}

/// MTTL's communication layer over VIA.
pub struct ViaTransport {
    rank: usize,
    nic: Nic,
    ptag: Ptag,
    cq: Cq,
    slot: usize,
    peers: Vec<Option<Peer>>,
    /// VI id → node.
    vi_node: Vec<usize>,
    recv_mem: MemoryRegion,
    /// The pool every VI draws its receives from, and the slot of each
    /// descriptor posted there (by the descriptor's address).
    srq: Srq,
    slot_of: HashMap<usize, usize>,
    pool: usize,
    /// Frames copied out of the pool to give their slots back.
    spilled: u64,
    send_mem: MemoryRegion,
    free_slots: Vec<usize>,
    descs: Vec<Descriptor>,
    /// A flush's batch of descriptors and what each frees, kept empty
    /// between flushes (no allocation per batch).
    batch: (Vec<Descriptor>, Vec<Posted>),
    pending: PendingList,
    heap: MemoryRegion,
    max_xfer: usize,
    /// Transfers from this size up go by RDMA (`MTTL_VIA_BULK`, read once:
    /// every remote read and write asks).
    bulk_threshold: usize,
    closing: bool,
    /// The message `prob` found (completed, not yet taken): the oldest.
    stash: Option<(usize, Vec<u8>)>,
    /// The connections: made and being made ([`connect`]).
    links: connect::Links,
}

impl ViaTransport {
    /// `_pmttl_cominit`: opens the NIC (`MTTL_VIA_DEVICE`, default
    /// `/dev/via_eth0`), registers the heap and the slots and exchanges
    /// addresses; VIs to the peers are connected on demand, or all now
    /// with `MTTL_VIA_CONNECT=all` ([`connect`]).
    pub fn cominit(boot: &mut Boot, heap_bytes: usize) -> Result<ViaTransport> {
        let dev = std::env::var("MTTL_VIA_DEVICE").unwrap_or_else(|_| "/dev/via_eth0".into());
        // MTTL polls the layer whenever its threads block or yield, so the
        // engine's own progress thread only competes for the CPU (about 2 µs
        // of a 32-byte remote read's 10): off unless VIA_PROGRESS_THREAD=1.
        let mut config = via_user::Config::from_env();
        if std::env::var_os("VIA_PROGRESS_THREAD").is_none() {
            config.progress_thread = false;
        }
        // For the same reason a received message's ACK can wait for the
        // next one of ours, or for the pause after the peer's last frame
        // (`Config::ack_idle`): MTTL's layer polls, so the engine serves
        // that timer. An ACK every 32 frames asked for a standalone one in
        // the middle of most large messages (CG's 56 KB exchange at MTU
        // 1500: 36.4 -> 32.7 us with an eighth of the window, 128 frames).
        if std::env::var_os("VIA_ACK_EVERY").is_none() {
            config.ack_every = 0; // an eighth of the window, at least 32
        }
        // Without that thread a process computing for seconds (NPB CG's
        // matrix generation, say) does not acknowledge meanwhile; its
        // peers must keep retrying rather than declare it dead after the
        // engine's default few seconds. A crashed rank is caught by
        // mttl-run (or the cluster launcher) anyway. VIA_RETRY_LIMIT
        // overrides.
        if std::env::var_os("VIA_RETRY_LIMIT").is_none() {
            while config.connection_timeout() < Duration::from_secs(120) && config.retry_limit < 10_000 {
                config.retry_limit += 1;
            }
        }
        // The pool may run dry while a rank computes: its peers' messages
        // wait (receiver-not-ready refusals, the longest back-off 10 ms)
        // for as long as a silent peer is waited for. VIA_RNR_RETRY
        // overrides.
        config.rnr = true;
        if std::env::var_os("VIA_RNR_RETRY").is_none() {
            config.rnr_retry_limit = 12_000;
        }
        let opened = via_user::open_device(&dev).map_err(|e| via_user::ViaError::new(via_user::VipReturn::InvalidParameter, e.to_string()));
        let nic = opened
            .and_then(|d| Nic::with_device(&dev, d, config))
            .map_err(|e| err(format!("opening {dev}: {e} (MTTL_VIA_DEVICE names the VIA device)")))?;
        let ptag = nic.create_ptag().map_err(err)?;
        let (rank, size) = (boot.rank, boot.size);
        let nic_attrs = nic.attributes();
        let slot_default = if nic_attrs.native_mtu > SLOT_DEFAULT { SLOT_JUMBO } else { SLOT_DEFAULT };
        let slot = env_usize("MTTL_VIA_SLOT", slot_default).max(256);
        let recvs_default = (RECV_BUDGET / slot / size.saturating_sub(1).max(1)).clamp(RECVS_MIN, RECVS_MAX);
        let recvs = env_usize("MTTL_VIA_RECVS", recvs_default).max(4) as u32;
        let pool = env_usize("MTTL_VIA_POOL", (recvs as usize * size.saturating_sub(1).max(1)).min(POOL_MAX)).max(4);
        let max_xfer = nic_attrs.max_transfer_size as usize;
        let plain = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
        let heap = MemoryRegion::new(&nic, heap_bytes.max(4096), 4096, MemAttributes { ptag, enable_rdma_write: true, enable_rdma_read: true })
            .map_err(|e| err(format!("registering a {} MiB heap: {e} (MTTL_HEAP_MB sets its size)", heap_bytes >> 20)))?;
        let recv_mem = MemoryRegion::new(&nic, pool * slot, 64, plain).map_err(err)?;
        let srq = nic.create_srq(ptag, pool).map_err(err)?;
        let send_mem = MemoryRegion::new(&nic, SEND_SLOTS * slot, 64, plain).map_err(err)?;
        let cq = nic.create_cq(4096).map_err(err)?;

        boot.connect()?;
        let mut blob = nic.mac().0.to_vec();
        blob.extend_from_slice(&heap.remote(0..heap.len()).map_err(err)?.to_bytes());
        let blobs = boot.exchange(&blob, crate::registry::digest())?;

        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: max_xfer as u32, ptag, enable_rdma_write: true, enable_rdma_read: true };
        let mut addrs = Vec::with_capacity(size);
        for (j, b) in blobs.iter().enumerate() {
            if j == rank {
                addrs.push(None);
                continue;
            }
            if b.len() != 6 + RemoteBuffer::BYTES {
                return Err(err(format!("rank {j} sent a {}-byte address", b.len())));
            }
            addrs.push(Some((MacAddr(b[..6].try_into().unwrap()), RemoteBuffer::from_bytes(&b[6..]).map_err(err)?)));
        }
        let on_demand = match std::env::var("MTTL_VIA_CONNECT").as_deref() {
            Ok("all") => false,
            Ok("demand") | Err(_) => true,
            Ok(other) => return Err(err(format!("MTTL_VIA_CONNECT is all or demand, not {other:?}"))),
        };
        let mut t = ViaTransport {
            rank,
            nic,
            ptag,
            cq,
            slot,
            peers: (0..size).map(|_| None).collect(),
            vi_node: Vec::new(),
            recv_mem,
            srq,
            slot_of: HashMap::with_capacity(pool),
            pool,
            spilled: 0,
            send_mem,
            free_slots: (0..SEND_SLOTS).rev().collect(),
            descs: Vec::new(),
            batch: (Vec::new(), Vec::new()),
            pending: PendingList::default(),
            heap,
            max_xfer,
            bulk_threshold: env_usize("MTTL_VIA_BULK", 4096),
            closing: false,
            stash: None,
            links: connect::Links::new(addrs, recvs, attrs, on_demand),
        };
        for s in 0..pool {
            t.repost(s)?;
        }
        if !on_demand {
            t.connect_all()?;
        }
        boot.finish()?;
        Ok(t)
    }

    fn slot_range(&self, s: usize) -> std::ops::Range<usize> {
        s * self.slot..(s + 1) * self.slot
    }

    fn desc(&mut self) -> Result<Descriptor> {
        match self.descs.pop() {
            Some(d) => Ok(d),
            None => Descriptor::new(&self.nic, self.ptag, 1).map_err(err),
        }
    }

    /// A receive descriptor over slot `s`, its kind byte cleared.
    fn recv_desc(&mut self, s: usize) -> Result<Descriptor> {
        let r = self.slot_range(s);
        self.recv_mem.write(r.start + 4, &[0]).map_err(err)?;
        let mut d = self.desc()?;
        d.set(&[(&self.recv_mem, r)], None).map_err(err)?;
        Ok(d)
    }

    /// Posts receive slot `s` to the pool.
    fn repost(&mut self, s: usize) -> Result<()> {
        let d = self.recv_desc(s)?;
        self.slot_of.insert(d.addr(), s);
        self.srq.post_recv(d).map_err(|(_, e)| err(format!("posting to the receive pool: {e}")))
    }

    /// The connection to `node`, made now if it is not yet.
    fn peer(&mut self, node: usize) -> Result<&mut Peer> {
        let rank = self.rank;
        if self.peers.get(node).is_some_and(Option::is_none) && node != rank {
            self.connect(node)?;
        }
        self.peers.get_mut(node).and_then(|p| p.as_mut()).ok_or_else(|| err(format!("rank {rank}: no VI to node {node}")))
    }

    /// Posts what the backlog of `node` may post now (data needs a credit
    /// and a send slot), in one batch: one doorbell for all its frames.
    fn flush(&mut self, node: usize) -> Result<()> {
        let payload = self.slot - HDR;
        // (The batch's vectors are kept from flush to flush.)
        let (mut batch, mut recs) = std::mem::take(&mut self.batch);
        loop {
            let p = self.peers[node].as_mut().expect("peer");
            let Some(front) = p.backlog.front_mut() else { break };
            match front {
                Out::Msg { bytes, at, .. } if *at == 0 && bytes.len() + 4 <= payload => {
                    if !p.credits.can_send_data() {
                        break;
                    }
                    let Some(s) = self.free_slots.pop() else { break };
                    // Every whole small message queued behind it that fits.
                    let base = s * self.slot;
                    let mut fill = HDR;
                    let mut last_seq = 0;
                    while let Some(Out::Msg { bytes, at: 0, seq }) = p.backlog.front() {
                        if fill + 4 + bytes.len() > self.slot {
                            break;
                        }
                        self.send_mem.write(base + fill, &(bytes.len() as u32).to_le_bytes()).map_err(err)?;
                        self.send_mem.write(base + fill + 4, bytes).map_err(err)?;
                        fill += 4 + bytes.len();
                        last_seq = *seq;
                        p.backlog.pop_front();
                    }
                    let mut hdr = [0u8; HDR];
                    hdr[..4].copy_from_slice(&p.credits.on_send().to_le_bytes());
                    hdr[4] = frame::PACKED;
                    self.send_mem.write(base, &hdr).map_err(err)?;
                    let mut d = self.desc()?;
                    d.set(&[(&self.send_mem, base..base + fill)], None).map_err(err)?;
                    batch.push(d);
                    recs.push(Posted { slot: Some(s), seq: Some(last_seq) });
                }
                Out::Msg { bytes, at, seq } => {
                    if !p.credits.can_send_data() {
                        break;
                    }
                    let Some(s) = self.free_slots.pop() else { break };
                    let n = (bytes.len() - *at).min(payload);
                    let last = *at + n == bytes.len();
                    self.send_mem.write(s * self.slot + HDR, &bytes[*at..*at + n]).map_err(err)?;
                    *at += n;
                    let (report, seq) = (p.credits.on_send(), last.then_some(*seq));
                    if last {
                        p.backlog.pop_front();
                    }
                    batch.push(self.fragment(s, n, report, last)?);
                    recs.push(Posted { slot: Some(s), seq });
                }
                Out::Staged { frags, seq } => {
                    if !p.credits.can_send_data() {
                        break;
                    }
                    let Some((s, n)) = frags.pop_front() else { break };
                    let last = frags.is_empty();
                    let (report, seq) = (p.credits.on_send(), last.then_some(*seq));
                    if last {
                        p.backlog.pop_front();
                    }
                    batch.push(self.fragment(s, n, report, last)?);
                    recs.push(Posted { slot: Some(s), seq });
                }
                Out::Put { xfer, imm } => {
                    if xfer.next_is_last(self.max_xfer) {
                        if !p.credits.can_send_data() {
                            break;
                        }
                        p.credits.on_send_without_report();
                    }
                    let (piece, imm, seq) = (xfer.cut(self.max_xfer), *imm, xfer.seq);
                    let op = Op::RdmaWrite(p.heap.offset(piece.dst as u64));
                    let local = piece.src..piece.src + piece.len;
                    if piece.last {
                        p.backlog.pop_front();
                    }
                    batch.push(self.heap_op(op, local, piece.last.then_some(imm))?);
                    recs.push(Posted { slot: None, seq: piece.last.then_some(seq) });
                }
                Out::Get { xfer } => {
                    let (piece, seq) = (xfer.cut(self.max_xfer), xfer.seq);
                    let op = Op::RdmaRead(p.heap.offset(piece.src as u64));
                    let local = piece.dst..piece.dst + piece.len;
                    if piece.last {
                        p.backlog.pop_front();
                    }
                    batch.push(self.heap_op(op, local, None)?);
                    recs.push(Posted { slot: None, seq: piece.last.then_some(seq) });
                }
                &mut Out::Atomic { dst, result, op, seq } => {
                    let remote = p.heap.offset(dst as u64);
                    let op = match op {
                        AtomicOp::FetchAdd(add) => Op::FetchAdd { remote, add },
                        AtomicOp::CompareSwap { compare, swap } => Op::CompareSwap { remote, compare, swap },
                    };
                    p.backlog.pop_front();
                    batch.push(self.heap_op(op, result..result + 8, None)?);
                    recs.push(Posted { slot: None, seq: Some(seq) });
                }
            }
        }
        let r = if batch.is_empty() { Ok(()) } else { self.post(node, &mut batch, &mut recs) };
        batch.clear();
        recs.clear();
        self.batch = (batch, recs);
        r
    }

    /// The descriptor of an RDMA operation on `local`, a range of our heap.
    fn heap_op(&mut self, op: Op, local: Range<usize>, imm: Option<u32>) -> Result<Descriptor> {
        let mut d = self.desc()?;
        d.set_op(op, &[(&self.heap, local)], imm, false).map_err(err)?;
        Ok(d)
    }

    /// The descriptor of a MORE or LAST fragment whose `n` payload bytes
    /// are in send slot `s`; writes its header (credit `report`) first.
    fn fragment(&mut self, s: usize, n: usize, report: u32, last: bool) -> Result<Descriptor> {
        let base = s * self.slot;
        let mut hdr = [0u8; HDR];
        hdr[..4].copy_from_slice(&report.to_le_bytes());
        hdr[4] = if last { frame::LAST } else { frame::MORE };
        self.send_mem.write(base, &hdr).map_err(err)?;
        let mut d = self.desc()?;
        d.set(&[(&self.send_mem, base..base + HDR + n)], None).map_err(err)?;
        Ok(d)
    }

    /// Posts every peer's backlog (sends are queued by `asend` and go out
    /// at the next call that makes progress, in batches).
    fn flush_all(&mut self) -> Result<()> {
        for j in 0..self.peers.len() {
            if self.peers[j].as_ref().is_some_and(|p| !p.backlog.is_empty() && !p.closed) {
                self.flush(j)?;
            }
        }
        Ok(())
    }

    /// Posts `batch` to `node`'s VI with one doorbell; `recs` say what
    /// each descriptor's completion frees.
    fn post(&mut self, node: usize, batch: &mut Vec<Descriptor>, recs: &mut Vec<Posted>) -> Result<()> {
        let rank = self.rank;
        let p = self.peers[node].as_mut().expect("peer");
        p.vi.post_sends(batch.drain(..)).map_err(|e| err(format!("rank {rank}: posting sends to rank {node}: {e}")))?;
        p.posted.extend(recs.drain(..));
        Ok(())
    }

    /// A credit-only frame, if the peer may be waiting for our report
    /// (it takes no credit: the peer absorbs it on arrival).
    fn maybe_report(&mut self, node: usize) -> Result<()> {
        let p = self.peers[node].as_mut().expect("peer");
        if p.closed || !p.credits.owe_report() {
            return Ok(());
        }
        let Some(s) = self.free_slots.pop() else { return Ok(()) };
        let report = p.credits.on_send_report();
        let base = s * self.slot;
        let mut hdr = [0u8; HDR];
        hdr[..4].copy_from_slice(&report.to_le_bytes());
        hdr[4] = frame::CREDIT;
        self.send_mem.write(base, &hdr).map_err(err)?;
        let mut d = self.desc()?;
        d.set(&[(&self.send_mem, base..base + HDR)], None).map_err(err)?;
        self.post(node, &mut vec![d], &mut vec![Posted { slot: Some(s), seq: None }])
    }

    /// Files one CQ entry: receives go to the pending list's tail, sends
    /// complete at once.
    fn on_completion(&mut self, c: Completion) -> Result<()> {
        let node = *self.vi_node.get(c.vi as usize).filter(|&&n| n != usize::MAX).ok_or_else(|| err(format!("a completion for VI {}, which is not ours", c.vi)))?;
        if self.peers[node].is_none() && !self.promote(node)? {
            return Err(err(format!("rank {}: a completion on the VI to rank {node} before it connected", self.rank)));
        }
        if c.recv_queue {
            // The descriptor (a pool slot) is taken now, and its credit
            // report read, while the frame waits to be consumed: credits
            // must flow even while nobody takes messages.
            let rank = self.rank;
            let p = self.peers[node].as_mut().expect("peer");
            let Some(d) = p.vi.recv_done().map_err(err)? else {
                return Err(err(format!("rank {rank}: the CQ named a receive of rank {node} that is not done")));
            };
            let s = self.slot_of.remove(&d.addr()).ok_or_else(|| err("a receive completed in a descriptor the pool never had"))?;
            if d.check_ok().is_ok() {
                let mut hdr = [0u8; HDR];
                self.recv_mem.read(s * self.slot, &mut hdr).map_err(err)?;
                if matches!(hdr[4], frame::MORE | frame::LAST | frame::CREDIT | frame::PACKED) {
                    p.credits.on_report(u32::from_le_bytes(hdr[..4].try_into().unwrap()));
                }
                if hdr[4] == frame::CREDIT && d.length() as usize == HDR && d.immediate().is_none() {
                    // A credit-only frame is absorbed now, its receive
                    // posted again: it took no credit (`Credits`), so it
                    // must not wait behind data nobody takes yet.
                    self.descs.push(d);
                    return self.repost(s);
                }
            }
            p.arrived.push_back((d, Held::Slot(s)));
            self.pending.push_back(node);
            return Ok(());
        }
        let rank = self.rank;
        let p = self.peers[node].as_mut().expect("peer");
        let Some(d) = p.vi.send_done().map_err(err)? else { return Ok(()) };
        let rec = p.posted.pop_front().ok_or_else(|| err("a send completion with nothing posted"))?;
        if let Err(e) = d.check_ok() {
            if self.closing {
                p.closed = true;
            } else {
                return Err(err(format!("rank {rank}: a send to rank {node} failed: {e}; did rank {node} stop?")));
            }
        }
        if let Some(seq) = rec.seq {
            p.completed = seq;
        }
        if let Some(s) = rec.slot {
            self.free_slots.push(s);
        }
        self.descs.push(d);
        Ok(())
    }

    /// Posts the backlogs and files every completion there is.
    fn poll(&mut self) -> Result<()> {
        self.answer_now_and_then()?;
        self.flush_all()?;
        let mut any = false;
        while let Some(c) = self.cq.done().map_err(err)? {
            self.on_completion(c)?;
            any = true;
        }
        if any {
            // Freed slots may let backlogs go on.
            self.flush_all()?;
        }
        Ok(())
    }

    fn wait_one(&mut self) -> Result<()> {
        self.poll()?;
        if !self.pending.is_empty() {
            return Ok(());
        }
        if self.links.unconnected() == 0 && self.peers.iter().flatten().all(|p| p.closed) {
            return Err(err(format!("rank {}: waiting for a message, but every peer has closed", self.rank)));
        }
        // A peer that asks for a connection wakes the wait too. While a
        // connection is being made the wait is short: a VI of the peer
        // model is connected only when asked whether it is (`promote`).
        let timeout = (self.links.connecting() > 0).then_some(Duration::from_millis(1));
        self.wait_event(timeout)
    }

    /// Completes the oldest receive of `node` (`VipRecvDone`), posts its
    /// slot again and returns the message it finished, if any.
    fn consume(&mut self, node: usize, out: &mut Vec<u8>) -> Result<bool> {
        let rank = self.rank;
        let p = self.peers[node].as_mut().expect("peer");
        if let Some(m) = p.unpacked.pop_front() {
            *out = m;
            return Ok(true);
        }
        let Some((d, held)) = p.arrived.pop_front() else {
            return Err(err(format!("rank {rank}: the pending list named rank {node}, which has no receive completed")));
        };
        let slot = match held {
            Held::Slot(s) => Some(s),
            Held::Copy(_) => None,
        };
        if let Err(e) = d.check_ok() {
            // Flushed: the connection is gone (the peer closed or died).
            p.closed = true;
            self.descs.push(d);
            if self.closing {
                return Ok(false);
            }
            let why = self.nic.take_async_errors();
            return Err(err(format!("rank {rank}: the connection to rank {node} was lost ({e}; asynchronous errors: {why:?}; {:?}); did rank {node} stop?", self.nic.counters())));
        }
        p.credits.on_consume();
        let got = if let Some(imm) = d.immediate() {
            out.clear();
            out.push(BULK_NOTICE);
            out.extend_from_slice(&imm.to_le_bytes());
            true
        } else {
            let len = d.length() as usize;
            if len < HDR {
                return Err(err(format!("rank {rank}: a {len}-byte frame from rank {node}")));
            }
            let f = match &held {
                Held::Slot(s) => FrameBytes::Slot(&self.recv_mem, s * self.slot),
                Held::Copy(c) => FrameBytes::Copy(c),
            };
            let mut hdr = [0u8; HDR];
            f.read(0, &mut hdr)?;
            let body = HDR..len;
            match hdr[4] {
                frame::CREDIT => return Err(err(format!("rank {rank}: a {len}-byte credit-only frame from rank {node} (they are {HDR} bytes)"))),
                frame::MORE => {
                    f.append_to(body, &mut p.partial)?;
                    false
                }
                frame::PACKED => {
                    // Each message is copied once, straight from the slot
                    // into its own buffer (the first into `out`).
                    let mut at = body.start;
                    let mut first = true;
                    while at < body.end {
                        let mut len = [0u8; 4];
                        let n = match f.read(at, &mut len) {
                            Ok(()) if at + 4 <= body.end => u32::from_le_bytes(len) as usize,
                            _ => usize::MAX,
                        };
                        let Some(msg) = (at + 4).checked_add(n).filter(|&end| end <= body.end).map(|end| at + 4..end) else {
                            return Err(err(format!("rank {rank}: a packed frame from rank {node} with an inconsistent length at byte {}", at - body.start)));
                        };
                        if first {
                            out.clear();
                            f.append_to(msg.clone(), out)?;
                            first = false;
                        } else {
                            let mut m = Vec::with_capacity(msg.len());
                            f.append_to(msg.clone(), &mut m)?;
                            p.unpacked.push_back(m);
                            self.pending.push_back(node);
                        }
                        at = msg.end;
                    }
                    if first {
                        return Err(err(format!("rank {rank}: an empty packed frame from rank {node}")));
                    }
                    true
                }
                frame::LAST => {
                    // The fragments gathered so far become the message (a
                    // swap, not a copy); the last one is appended.
                    out.clear();
                    std::mem::swap(out, &mut p.partial);
                    f.append_to(body, out)?;
                    true
                }
                k => return Err(err(format!("rank {rank}: a frame of unknown kind {k} from rank {node}"))),
            }
        };
        self.descs.push(d);
        if let Some(s) = slot {
            self.repost(s)?;
        }
        self.maybe_report(node)?;
        Ok(got)
    }

    /// Copies out the frames that completed receives hold in the pool and
    /// gives their slots back to it, if the pool has fewer than
    /// 1/[`SPILL_BELOW`] of its slots left. Called by `brecnode` when it
    /// waits for one node while others' messages sit in the pool: those
    /// would otherwise keep the pool empty, and the awaited node's
    /// messages refused, for good.
    fn spill(&mut self) -> Result<()> {
        if self.srq.len().map_err(err)? * SPILL_BELOW >= self.pool {
            return Ok(());
        }
        let mut freed = Vec::new();
        for p in self.peers.iter_mut().flatten() {
            for (d, held) in p.arrived.iter_mut() {
                let Held::Slot(s) = *held else { continue };
                if d.check_ok().is_err() {
                    continue;
                }
                let base = s * self.slot;
                let copy = self.recv_mem.to_vec(base..base + (d.length() as usize).min(self.slot)).map_err(err)?;
                *held = Held::Copy(copy);
                freed.push(s);
            }
        }
        self.spilled += freed.len() as u64;
        for s in freed {
            self.repost(s)?;
        }
        Ok(())
    }

    /// Gathers a message of more than half a slot straight into send
    /// slots (one copy instead of two), if it may take them: staged slots
    /// wait for credits in the backlog, so staging never takes the last
    /// half of the slots, which stay for other peers and credit reports.
    /// `None`: the message is queued as bytes (small ones are packed
    /// together when they are posted).
    fn stage(&mut self, node: usize, parts: &[&[u8]]) -> Result<Option<VecDeque<(usize, usize)>>> {
        let payload = self.slot - HDR;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let fragments = len.div_ceil(payload);
        if len <= payload / 2 || self.free_slots.len() < fragments + SEND_SLOTS / 2 || self.peer(node)?.closed {
            return Ok(None);
        }
        let mut frags = VecDeque::with_capacity(fragments);
        let mut rest = parts.iter().copied().filter(|p| !p.is_empty());
        let mut part: &[u8] = rest.next().unwrap_or_default();
        while frags.len() < fragments {
            let s = self.free_slots.pop().expect("counted above");
            let start = s * self.slot + HDR;
            let mut fill = 0;
            while fill < payload {
                if part.is_empty() {
                    match rest.next() {
                        Some(p) => part = p,
                        None => break,
                    }
                }
                let n = part.len().min(payload - fill);
                self.send_mem.write(start + fill, &part[..n]).map_err(err)?;
                part = &part[n..];
                fill += n;
            }
            frags.push_back((s, fill));
        }
        Ok(Some(frags))
    }

    /// Queues what `make` builds from the send's sequence number.
    fn enqueue(&mut self, node: usize, make: impl FnOnce(u64) -> Out) -> Result<SendHandle> {
        let rank = self.rank;
        let p = self.peer(node)?;
        if p.closed {
            return Err(err(format!("rank {rank}: sending to rank {node}, whose connection is closed")));
        }
        p.queued += 1;
        let seq = p.queued;
        p.backlog.push_back(make(seq));
        Ok(SendHandle { node, seq })
    }
}

impl Transport for ViaTransport {
    fn name(&self) -> &'static str {
        "via"
    }

    fn comfinish(&mut self) -> Result<()> {
        self.closing = true;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut scratch = Vec::new();
        while self.peers.iter().flatten().any(|p| !p.closed && p.completed < p.queued) {
            self.flush_all()?;
            if Instant::now() > deadline {
                return Err(err(format!("rank {}: sends not delivered within 60 s of the end; {}", self.rank, self.describe())));
            }
            match self.cq.wait(Some(Duration::from_millis(200))) {
                Ok(c) => self.on_completion(c)?,
                Err(e) if e.code == via_user::VipReturn::Timeout => {}
                Err(e) => return Err(err(e)),
            }
            // Messages that still come only matter for their credits.
            while let Some(n) = self.pending.pop_front() {
                self.consume(n, &mut scratch)?;
            }
        }
        if std::env::var_os("MTTL_VIA_COUNTERS").is_some_and(|v| v != "0") {
            let c = self.nic.counters();
            let shown: Vec<String> = c.pairs().iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k} {v}")).collect();
            let dev: Vec<String> = self.nic.device_counters().iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k} {v}")).collect();
            eprintln!("via rank {}: engine counters: {}; device counters: {}; frames spilled from the receive pool: {}", self.rank, shown.join(", "), dev.join(", "), self.spilled);
        }
        for p in self.peers.iter_mut().flatten() {
            let _ = p.vi.disconnect();
        }
        Ok(())
    }

    fn closing(&mut self) {
        self.closing = true;
    }

    fn describe(&self) -> String {
        let pool = self.srq.len().map_or_else(|e| e.to_string(), |n| n.to_string());
        let mut s = format!("via rank {}: pending {}, stash {:?}, free send slots {}, receives in the pool {pool} of {}, spilled {}; ", self.rank, self.pending.len(), self.stash.as_ref().map(|x| x.0), self.free_slots.len(), self.pool, self.spilled);
        for (j, p) in self.peers.iter().enumerate() {
            if let Some(p) = p {
                s += &format!(
                    "[{j}: arrived {}, partial {}, unpacked {}, backlog {}, posted {}, queued {}, completed {}, closed {}, vi {:?}, vi posted {:?}, {:?}, {}] ",
                    p.arrived.len(),
                    p.partial.len(),
                    p.unpacked.len(),
                    p.backlog.len(),
                    p.posted.len(),
                    p.queued,
                    p.completed,
                    p.closed,
                    p.vi.query().0,
                    p.vi.posted(),
                    p.credits,
                    p.vi.transport_state()
                );
            }
        }
        s + &format!("counters {:?}", self.nic.counters())
    }

    fn prob(&mut self) -> Result<Option<usize>> {
        // Messages already in hand go first; queued sends are posted (in
        // one batch) only when we have to look at the CQ.
        for polled in [false, true] {
            if let Some((n, _)) = self.stash {
                return Ok(Some(n));
            }
            if polled {
                self.poll()?;
            }
            // Fragments and credit-only frames at the head are absorbed;
            // the first whole message is kept for the next brec*.
            let mut m = Vec::new();
            while let Some(n) = self.pending.pop_front() {
                if self.consume(n, &mut m)? {
                    self.stash = Some((n, m));
                    return Ok(Some(n));
                }
            }
        }
        Ok(None)
    }

    fn nsendv(&mut self, node: usize, parts: &[&[u8]]) -> Result<SendHandle> {
        match self.stage(node, parts)? {
            Some(frags) => self.enqueue(node, |seq| Out::Staged { frags, seq }),
            None => self.enqueue(node, |seq| Out::Msg { bytes: parts.concat(), at: 0, seq }),
        }
    }

    fn senddone(&mut self, h: SendHandle) -> Result<bool> {
        self.peer(h.node)?;
        if self.delivered(h) {
            return Ok(true);
        }
        self.poll()?;
        Ok(self.delivered(h))
    }

    fn delivered(&self, h: SendHandle) -> bool {
        self.peers.get(h.node).and_then(Option::as_ref).is_some_and(|p| p.completed >= h.seq)
    }

    fn brecnode(&mut self, node: usize, out: &mut Vec<u8>) -> Result<()> {
        self.peer(node)?;
        if self.stash.as_ref().is_some_and(|(n, _)| *n == node) {
            *out = self.stash.take().unwrap().1;
            return Ok(());
        }
        loop {
            if self.pending.take(node) {
                if self.consume(node, out)? {
                    return Ok(());
                }
                continue;
            }
            if self.peer(node)?.closed {
                return Err(err(format!("rank {}: waiting for rank {node}, whose connection is closed", self.rank)));
            }
            if !self.pending.is_empty() {
                self.spill()?; // others' messages, which may fill the pool
            }
            self.wait_one()?;
        }
    }

    fn brecany(&mut self, out: &mut Vec<u8>) -> Result<usize> {
        if let Some((n, m)) = self.stash.take() {
            *out = m;
            return Ok(n);
        }
        loop {
            match self.pending.pop_front() {
                Some(n) => {
                    if self.consume(n, out)? {
                        return Ok(n);
                    }
                }
                None => self.wait_one()?,
            }
        }
    }

    fn bulk(&mut self) -> Option<&mut dyn Bulk> {
        Some(self)
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.nic.device_counters()
    }

    fn connections(&self) -> Option<usize> {
        Some(self.peers.iter().flatten().count() + self.links.connecting())
    }

    fn heap(&mut self) -> (*mut u8, usize) {
        (self.heap.as_ptr(), self.heap.len())
    }
}

impl Bulk for ViaTransport {
    fn put(&mut self, node: usize, src_off: usize, dst_off: usize, len: usize, imm: u32) -> Result<SendHandle> {
        if src_off.checked_add(len).is_none_or(|e| e > self.heap.len()) {
            return Err(err(format!("a put of {len} bytes from heap offset {src_off:#x} runs past the heap")));
        }
        self.enqueue(node, |seq| Out::Put { xfer: HeapTransfer { src: src_off, dst: dst_off, len, seq }, imm })
    }

    fn get(&mut self, node: usize, src_off: usize, dst_off: usize, len: usize) -> Result<SendHandle> {
        if dst_off.checked_add(len).is_none_or(|e| e > self.heap.len()) {
            return Err(err(format!("a read of {len} bytes into heap offset {dst_off:#x} runs past the heap")));
        }
        let rank = self.rank;
        let theirs = self.peer(node)?.heap.len;
        if (src_off as u64).checked_add(len as u64).is_none_or(|e| e > theirs) {
            return Err(err(format!("rank {rank}: a read of {len} bytes at heap offset {src_off:#x} of rank {node} is outside its heap of {theirs} bytes")));
        }
        self.enqueue(node, |seq| Out::Get { xfer: HeapTransfer { src: src_off, dst: dst_off, len, seq } })
    }

    fn atomic(&mut self, node: usize, off: usize, op: AtomicOp, result_off: usize) -> Result<SendHandle> {
        if result_off.checked_add(8).is_none_or(|e| e > self.heap.len()) {
            return Err(err(format!("an atomic's result at heap offset {result_off:#x} runs past the heap")));
        }
        let rank = self.rank;
        let theirs = self.peer(node)?.heap.len;
        if !off.is_multiple_of(8) || (off as u64).checked_add(8).is_none_or(|e| e > theirs) {
            return Err(err(format!("rank {rank}: an atomic at heap offset {off:#x} of rank {node}: not an aligned word of its heap of {theirs} bytes")));
        }
        self.enqueue(node, |seq| Out::Atomic { dst: off, result: result_off, op, seq })
    }

    fn threshold(&self) -> usize {
        self.bulk_threshold
    }
}
