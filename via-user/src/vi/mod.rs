//! The state of one VI: attributes, connection, work queues, and its
//! protocol state in parts, each with one job: the [`Sender`] and the
//! [`Receiver`] of the sequenced stream, the sender's [`Retransmission`]
//! timer and [`SelectiveRepeat`], the receiver's [`AckScheduler`], and the
//! [`ReadServer`] of the peer's RDMA reads. The engine drives them.

mod ack;
mod retransmit;
mod selective;

pub use ack::{AckDue, AckScheduler, AckTiming};
pub use retransmit::{give_up_after, Expiry, Retransmission};
pub use selective::SelectiveRepeat;

use crate::reorder::ReorderBuffer;
use crate::workqueue::WorkQueue;
use std::collections::VecDeque;
use crate::clock::{earlier, Time};
use std::time::Duration;
use via_wire::{seq_le, seq_lt, ContinuationKey, HeaderTemplate};
use via_kernel_agent::conn::Peer;
use via_kernel_agent::memory::Ptag;

/// `VIP_RELIABILITY_LEVEL` bits.
pub mod reliability {
    pub const UNRELIABLE: u16 = 0x01;
    pub const RELIABLE_DELIVERY: u16 = 0x02;
    pub const RELIABLE_RECEPTION: u16 = 0x04;
}

/// The service a VI gives (`VIP_RELIABILITY_LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reliability {
    /// At most once; losses are possible and never break the connection.
    Unreliable,
    /// Exactly once, in order; a send completes when the peer acknowledged it.
    ReliableDelivery,
    /// As reliable delivery; the peer acknowledges only after placing the
    /// data in the receive buffer (which is what this engine always does).
    ReliableReception,
}

impl Reliability {
    pub fn bits(self) -> u16 {
        match self {
            Reliability::Unreliable => reliability::UNRELIABLE,
            Reliability::ReliableDelivery => reliability::RELIABLE_DELIVERY,
            Reliability::ReliableReception => reliability::RELIABLE_RECEPTION,
        }
    }

    pub fn from_bits(b: u16) -> Option<Reliability> {
        match b {
            reliability::UNRELIABLE => Some(Reliability::Unreliable),
            reliability::RELIABLE_DELIVERY => Some(Reliability::ReliableDelivery),
            reliability::RELIABLE_RECEPTION => Some(Reliability::ReliableReception),
            _ => None,
        }
    }

    pub fn is_reliable(self) -> bool {
        self != Reliability::Unreliable
    }
}

/// `VIP_VI_ATTRIBUTES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViAttributes {
    pub reliability: Reliability,
    /// Largest message a descriptor of this VI may carry.
    pub max_transfer_size: u32,
    pub ptag: Ptag,
    pub enable_rdma_write: bool,
    pub enable_rdma_read: bool,
}

/// `VIP_VI_STATE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViPhase {
    Idle,
    Connected,
    ConnectPending,
    Error,
}

/// The message being reassembled on the receive side.
#[derive(Clone, Copy, Debug)]
pub struct RxMessage {
    /// Receive-queue index of the descriptor, `None` when the message is
    /// being discarded (unreliable VI with no receive posted).
    pub entry: Option<u32>,
    pub msg_seq: u32,
    pub msg_len: u32,
    /// Bytes placed so far (the offset the next fragment must carry).
    pub got: u32,
    /// Error bits the descriptor will complete with (LENGTH_ERROR...).
    pub error: u32,
    pub imm: Option<u32>,
    /// Scatter cursor: data segment and offset inside it.
    pub seg: u16,
    pub seg_off: u32,
    /// PSN of the message's first fragment (for error reports).
    pub first_psn: u32,
    /// RDMA write: the target address and memory handle; the data goes
    /// there and `entry` (if any) only receives the immediate data.
    pub rdma: Option<(usize, u32)>,
}

/// An RDMA read (or remote atomic) this VI serves: the response frames
/// still to send.
#[derive(Clone, Copy, Debug)]
pub struct ReadJob {
    /// PSN and message number of the request (echoed in every response).
    pub psn: u32,
    pub msg_seq: u32,
    /// Start of the requested range in our memory, checked when queued.
    pub addr: usize,
    pub handle: u32,
    pub len: u32,
    /// Next byte to send.
    pub off: u32,
    /// A remote atomic's answer: the target's value before it ran
    /// (little-endian), sent in place of memory at `addr`.
    pub value: Option<[u8; 8]>,
}

/// An RDMA read of the peer's that we served, remembered so that a
/// duplicate of its request (the requester lost part of the response and
/// asks again) can be told from one that is not: see
/// `Core::on_read_request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedRead {
    /// The request as it first came: PSN, message number, remote range.
    pub psn: u32,
    pub msg_seq: u32,
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
    /// The offset the last repeat asked from, and how many repeats asked
    /// from it.
    pub resume_off: u32,
    pub repeats: u32,
    /// A remote atomic we ran: its answer, given again to a duplicate of
    /// its request (it never runs twice).
    pub value: Option<[u8; 8]>,
}


/// One VI.
pub struct ViState {
    /// Its handle: what our frames' `src_vi` and the peer's `dst_vi` say.
    pub id: u16,
    /// Unique in the process ([`crate::workqueue::next_serial`]).
    pub serial: u64,
    pub attrs: ViAttributes,
    /// Names this VI with these attributes: drawn like `serial` when the
    /// VI is made and again whenever its attributes change, so that what
    /// a post validated under them is taken again only under them
    /// (`engine::post`'s kept records compare this one word).
    pub rules: u64,
    pub phase: ViPhase,
    pub send_cq: Option<u16>,
    pub recv_cq: Option<u16>,
    pub peer: Option<Peer>,
    pub sq: WorkQueue,
    pub rq: WorkQueue,
    /// Our sequenced stream: transmit position, acknowledgement.
    pub tx: Sender,
    /// The sender's timer and round-trip timing.
    pub rtx: Retransmission,
    /// The sender's selective repeat.
    pub sack: SelectiveRepeat,
    /// The peer's sequenced stream: expected PSN, reassembly, reordering.
    pub rx: Receiver,
    /// What the receiver owes the sender.
    pub acks: AckScheduler,
    /// The peer's RDMA reads that we serve.
    pub served: ReadServer,
    /// The shared receive queue it draws its receives from (an
    /// extension: `engine::srq`), if any.
    pub srq: Option<u16>,
}

/// The sending half of a VI's sequenced stream. Fragment `k` of a
/// message goes as PSN `first_psn + k`; `idx`, `off` and `psn` are the
/// transmit position, which go-back-N moves back.
#[derive(Clone, Debug, Default)]
pub struct Sender {
    /// Payload bytes per fragment on this connection (0 until the first
    /// send fixes it: the device's MTU to the peer).
    pub frag: u32,
    /// Data frames carry a CRC (fixed with `frag`: not over a path that
    /// cannot corrupt them).
    pub checksum: bool,
    /// Messages of at least this many bytes go whole, as one frame whose
    /// payload the device lends (fixed with `frag`, from the path's
    /// `lends_from`; None: never).
    pub lends_from: Option<u32>,
    /// The headers all frames of the connection share (fixed with `frag`).
    pub head: HeaderTemplate,
    /// Send-queue index and byte offset of the next fragment to transmit.
    pub idx: u32,
    pub off: u32,
    /// PSN of the next fragment to transmit.
    pub psn: u32,
    /// Oldest PSN not yet acknowledged.
    pub una: u32,
    /// One past the highest PSN ever transmitted (frames below it that go
    /// out again are retransmissions).
    pub sent_hi: u32,
    pub next_msg_seq: u32,
    /// RDMA reads transmitted and not yet completed.
    pub reads_outstanding: u32,
    /// Ask again for the rest of stalled RDMA reads (a response was lost).
    pub read_resume: bool,
    /// Receiver not ready: the peer refused the message at `una` for want
    /// of a receive; data is held until then (a back-off), and how many
    /// refusals came in a row.
    pub rnr_until: Option<crate::clock::Time>,
    pub rnr_refusals: u32,
    /// Going again after a retransmission timeout: the PSN the frames
    /// sent again stop at ([`RTO_BURST`] past where they start) until the
    /// peer's next ACK moves (`engine::receive`'s `on_ack`). A
    /// timeout that was spurious (the ACKs late, not the frames lost)
    /// then costs one burst, not the whole window again.
    pub burst_end: Option<u32>,
    /// Where this connection's sends may go boxed (fixed with `frag`: a
    /// peer on this host's shared-memory wire, `engine::boxed`).
    pub boxes: Option<via_device::BoxRoute>,
    /// The connection's words of its boxed messages' headers (fixed with
    /// `boxes`).
    pub box_head: via_device::BoxTemplate,
    /// Boxed messages sent on the connection (the last one's number).
    pub boxes_sent: u32,
    /// A frame or boxed message of the peer's came on this connection:
    /// it is connected (it takes what we box; none is ever sent again).
    pub peer_heard: bool,
    /// Boxed sends not yet completed (reliable delivery: until the peer
    /// says it placed them).
    pub boxes_out: u32,
    /// The count of our boxed sends the peer last said, in a boxed
    /// message's header, that it placed, not yet settled: settled off the
    /// receive path, at our next send, poll or flush (`engine::boxed`).
    pub placed_told: Option<u32>,
}

/// Frames that go again after a retransmission timeout before the peer's
/// next ACK (one batch for the device).
pub const RTO_BURST: u32 = 32;

impl Sender {
    /// Goes again from the transmit position (just sought) with a burst:
    /// [`RTO_BURST`] frames until the peer's next ACK.
    pub fn start_burst(&mut self) {
        self.burst_end = Some(self.psn.wrapping_add(RTO_BURST));
    }

    /// Frames sent and not yet acknowledged (from the transmit position).
    pub fn in_flight(&self) -> u32 {
        self.psn.wrapping_sub(self.una)
    }

    /// Frames ever transmitted and not yet acknowledged.
    pub fn unacknowledged(&self) -> u32 {
        self.sent_hi.wrapping_sub(self.una)
    }

    /// Is anything waiting for the peer: frames, RDMA reads or boxed
    /// sends?
    pub fn outstanding(&self) -> bool {
        self.una != self.sent_hi || self.reads_outstanding != 0 || self.boxes_out != 0
    }
}

/// The receiving half of a VI's sequenced stream.
#[derive(Default)]
pub struct Receiver {
    /// The PSN expected next.
    pub expected: u32,
    /// The message being reassembled.
    pub msg: Option<RxMessage>,
    /// What the later fragments of `msg` repeat of its first's headers
    /// (`engine::continuation`), written when a message's first fragment
    /// is not its last; a one-frame message is taken at once and never
    /// asks. (The default key matches no frame.)
    pub msg_key: ContinuationKey,
    /// Frames that arrived past a gap.
    pub reorder: ReorderBuffer,
    /// The last message that failed here and was reported to the sender:
    /// (first PSN, one past its last PSN, message number, status bits). A
    /// retransmission of it is answered with the report again.
    pub last_error: Option<(u32, u32, u32, u32)>,
    /// RDMA protection violations by the peer on this connection.
    pub prot_violations: u32,
    /// Receiver-not-ready mode: a message was refused for want of a
    /// receive, and the sender is to be told (a standalone ACK with RNR).
    pub rnr_owed: bool,
    /// The peer's boxed messages placed on this connection.
    pub boxes_placed: u32,
}

/// The peer's RDMA reads: those being answered, and those answered lately.
#[derive(Default)]
pub struct ReadServer {
    /// Reads the peer asked of us, answered in order.
    pub jobs: VecDeque<ReadJob>,
    /// The reads we served most recently (at most a work queue's worth:
    /// what a requester can have outstanding), oldest first.
    pub recent: VecDeque<ServedRead>,
}

impl ViState {
    pub fn new(id: u16, attrs: ViAttributes, send_cq: Option<u16>, recv_cq: Option<u16>, depth: usize, rto: (Duration, Duration)) -> Self {
        ViState {
            id,
            serial: crate::workqueue::next_serial(),
            attrs,
            rules: crate::workqueue::next_serial(),
            phase: ViPhase::Idle,
            send_cq,
            recv_cq,
            peer: None,
            sq: WorkQueue::new(depth),
            rq: WorkQueue::new(depth),
            tx: Sender::default(),
            rtx: Retransmission::new(rto.0, rto.1),
            sack: SelectiveRepeat::default(),
            rx: Receiver::default(),
            acks: AckScheduler::default(),
            served: ReadServer::default(),
            srq: None,
        }
    }

    pub fn reliable(&self) -> bool {
        self.attrs.reliability.is_reliable()
    }

    /// Resets the protocol state for a new connection (queues are kept);
    /// `rto`: the initial and the largest retransmission timeout.
    pub fn reset_protocol(&mut self, rto: (Duration, Duration)) {
        self.tx = Sender { idx: self.sq.done, next_msg_seq: self.tx.next_msg_seq, ..Sender::default() };
        self.rtx = Retransmission::new(rto.0, rto.1);
        self.sack = SelectiveRepeat::default();
        let rx = std::mem::take(&mut self.rx);
        self.rx = Receiver { reorder: rx.reorder, ..Receiver::default() };
        self.rx.reorder.clear();
        self.acks = AckScheduler::default();
        self.served.jobs.clear();
        self.served.recent.clear();
    }

    /// Moves the transmit position to PSN `psn`: back for go-back-N and
    /// for frames the device refused, forward when the peer acknowledges
    /// frames sent before a rewind. Fragmentation is deterministic
    /// (fragment `k` of a message is PSN `first_psn + k`), so the PSN
    /// names a send-queue entry and an offset in it. Entries that carry no
    /// frames are passed over: those that failed at post, and boxed sends
    /// (`engine::boxed`), which went whole into the peer's ring and are
    /// never sent again (they complete when the peer says it placed them).
    pub fn seek(&mut self, psn: u32) {
        let frag = self.tx.frag;
        let mut idx = self.sq.done;
        while idx != self.sq.tail {
            let e = self.sq.get(idx);
            if e.pre_status == 0 && !e.boxed {
                if e.nframes == 0 {
                    break; // never started: the position is its start
                }
                if seq_le(e.first_psn, psn) && seq_lt(psn, e.first_psn.wrapping_add(e.nframes)) {
                    self.tx.off = psn.wrapping_sub(e.first_psn) * frag;
                    self.tx.idx = idx;
                    self.tx.psn = psn;
                    return;
                }
            }
            idx = idx.wrapping_add(1);
        }
        self.tx.idx = idx;
        self.tx.off = 0;
        self.tx.psn = psn;
    }

    /// The earliest timer of this VI.
    pub fn next_timer(&self) -> Option<Time> {
        earlier(earlier(self.rtx.deadline(), self.acks.deadline()), self.tx.rnr_until)
    }
}
