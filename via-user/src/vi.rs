//! The state of one VI: attributes, connection, work queues, and the
//! per-direction protocol state (sequence numbers, retransmission, ACKs,
//! reassembly). The engine drives it; this module only holds it and answers
//! questions about it.

use crate::reorder::ReorderBuffer;
use crate::workqueue::WorkQueue;
use std::collections::VecDeque;
use crate::rtt::RttEstimator;
use std::time::{Duration, Instant};
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

/// An RDMA read this VI serves: the response frames still to send.
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
}


/// One VI.
pub struct ViState {
    /// Unique in the process ([`next_serial`]).
    pub serial: u64,
    pub attrs: ViAttributes,
    pub phase: ViPhase,
    pub send_cq: Option<u16>,
    pub recv_cq: Option<u16>,
    pub peer: Option<Peer>,
    pub sq: WorkQueue,
    pub rq: WorkQueue,

    // ---- sender ----
    /// Payload bytes per fragment on this connection (0 until the first
    /// send fixes it: the device's MTU to the peer).
    pub frag: u32,
    /// Send-queue index and byte offset of the next fragment to transmit.
    pub tx_idx: u32,
    pub tx_off: u32,
    /// PSN of the next fragment to transmit.
    pub tx_psn: u32,
    /// Oldest PSN not yet acknowledged.
    pub una: u32,
    /// One past the highest PSN ever transmitted (frames below it that go
    /// out again are retransmissions).
    pub sent_hi: u32,
    pub next_msg_seq: u32,
    pub rto_at: Option<Instant>,
    pub rto: Duration,
    /// Consecutive retransmission timeouts without progress.
    pub retries: u32,
    /// Round-trip time: smoothed estimate and mean deviation (RFC 6298),
    /// from timing one frame at a time that is never sent twice (Karn).
    pub rtt: RttEstimator,
    /// The frame being timed: its PSN and when it went out.
    pub rtt_probe: Option<(u32, Instant)>,
    /// The `una` for which a NAK already caused a rewind.
    pub nak_rewound: Option<u32>,
    /// Selective repeat (bit `i`: PSN `una + i`): frames the peer holds
    /// past a gap, by its last SACK; holes to transmit again; holes
    /// already transmitted again since the last timeout.
    pub sacked: u64,
    pub resend: u64,
    pub resent: u64,
    /// RDMA reads transmitted and not yet completed.
    pub reads_outstanding: u32,
    /// Ask again for the rest of stalled RDMA reads (a response was lost).
    pub read_resume: bool,
    /// RDMA reads the peer asked of us, answered in order.
    pub read_jobs: VecDeque<ReadJob>,
    /// The reads we served most recently (at most a work queue's worth:
    /// what a requester can have outstanding), oldest first.
    pub reads_served: VecDeque<ServedRead>,

    // ---- receiver ----
    pub rx_expected: u32,
    pub rx: Option<RxMessage>,
    /// Frames that arrived past a gap.
    pub reorder: ReorderBuffer,
    /// Frames accepted since the last ACK went out.
    pub ack_count: u32,
    pub ack_at: Option<Instant>,
    /// An ACK (or, with `nak`, a NAK) must go out in this progress round.
    pub ack_now: bool,
    pub nak: bool,
    /// The `rx_expected` a NAK was last sent for.
    pub nak_sent_for: Option<u32>,
    /// RDMA protection violations by the peer on this connection.
    pub prot_violations: u32,
    /// The last message that failed here and was reported to the sender:
    /// (first PSN, one past its last PSN, message number, status bits). A
    /// retransmission of it is answered with the report again.
    pub last_rx_error: Option<(u32, u32, u32, u32)>,
}

impl ViState {
    pub fn new(attrs: ViAttributes, send_cq: Option<u16>, recv_cq: Option<u16>, depth: usize, rto: Duration) -> Self {
        ViState {
            serial: crate::workqueue::next_serial(),
            attrs,
            phase: ViPhase::Idle,
            send_cq,
            recv_cq,
            peer: None,
            sq: WorkQueue::new(depth),
            rq: WorkQueue::new(depth),
            frag: 0,
            tx_idx: 0,
            tx_off: 0,
            tx_psn: 0,
            una: 0,
            sent_hi: 0,
            next_msg_seq: 0,
            rto_at: None,
            rto,
            retries: 0,
            rtt: RttEstimator::default(),
            rtt_probe: None,
            nak_rewound: None,
            sacked: 0,
            resend: 0,
            resent: 0,
            reads_outstanding: 0,
            read_resume: false,
            read_jobs: VecDeque::new(),
            reads_served: VecDeque::new(),
            rx_expected: 0,
            rx: None,
            reorder: ReorderBuffer::default(),
            ack_count: 0,
            ack_at: None,
            ack_now: false,
            nak: false,
            nak_sent_for: None,
            last_rx_error: None,
            prot_violations: 0,
        }
    }

    pub fn reliable(&self) -> bool {
        self.attrs.reliability.is_reliable()
    }

    /// Frames sent and not yet acknowledged.
    pub fn in_flight(&self) -> u32 {
        self.tx_psn.wrapping_sub(self.una)
    }

    /// Does the receiver owe the peer an acknowledgement?
    pub fn ack_owed(&self) -> bool {
        self.ack_count > 0 || self.ack_now || self.nak
    }

    /// Resets the protocol state for a new connection (queues are kept).
    pub fn reset_protocol(&mut self, rto: Duration) {
        self.frag = 0;
        self.tx_idx = self.sq.done;
        self.tx_off = 0;
        self.tx_psn = 0;
        self.una = 0;
        self.sent_hi = 0;
        self.rto_at = None;
        self.rto = rto;
        self.retries = 0;
        (self.rtt, self.rtt_probe) = (RttEstimator::default(), None);
        self.nak_rewound = None;
        (self.sacked, self.resend, self.resent) = (0, 0, 0);
        self.rx_expected = 0;
        self.rx = None;
        self.reorder.clear();
        self.ack_count = 0;
        self.ack_at = None;
        self.ack_now = false;
        self.nak = false;
        self.nak_sent_for = None;
        self.reads_outstanding = 0;
        self.read_resume = false;
        self.read_jobs.clear();
        self.reads_served.clear();
        self.last_rx_error = None;
        self.prot_violations = 0;
    }

    /// The earliest timer of this VI.
    pub fn next_timer(&self) -> Option<Instant> {
        match (self.rto_at, self.ack_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
