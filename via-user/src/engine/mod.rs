//! The VI protocol engine of one opened NIC.
//!
//! [`Engine`] owns the frame device and [`Core`], which owns everything
//! else: the registration table, the connection manager, the VIs and the
//! completion queues. All work happens in [`Engine::progress_at`]: receive a
//! batch of frames and dispatch them, run due timers, then transmit what the
//! doorbell, the ACK scheduler and the connection manager queued. The
//! public API calls progress inside every call that posts, polls or waits.
//!
//! Submodules: [`post`] (posting and completing descriptors), [`receive`]
//! (frame dispatch, reassembly, ACK processing), [`rdma_target`] (the
//! peer's RDMA into our memory, read requests and responses),
//! [`transmit`] (building and
//! sending frame batches), [`timers`] (retransmission, delayed ACKs),
//! [`crate::reorder`] (frames held past a gap for selective repeat),
//! [`connect`] (the connection calls).

mod authenticate;
mod boxed;
mod connect;
mod continuation;
mod outbox;
pub mod post;
mod rdma_target;
mod receive;
pub mod srq;
mod timers;
mod transmit;

pub use connect::IncomingRequest;
#[cfg(feature = "test-support")]
pub use rdma_target::UNRELIABLE_VIOLATION_LIMIT;

use crate::clock::{Clock, Time};
use crate::error::{Result, ViaError};
use crate::vi::{ViAttributes, ViPhase, ViState};
use crate::workqueue::CompletionQueue;
use outbox::Outbox;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};
use via_kernel_agent::auth::{ClusterSecret, Keyring};
use via_kernel_agent::conn::ConnectionManager;
use via_kernel_agent::names::NameService;
use via_kernel_agent::peer::PeerConnector;
use via_kernel_agent::resolver::{default_local_names, Resolver};
use via_kernel_agent::memory::{random_u32, RegistrationTable};
use via_wire::{ANY_ENDPOINT, DST_EP_OFFSET, ETHERTYPE, FRAME_HEADER_LEN, VIA_HEADER_LEN};
use via_device::{FrameDevice, MacAddr, RxFilter};

/// Frames built and handed to the device per doorbell.
pub const BATCH: usize = 32;
/// How soon a waiting engine tries again to send control frames its device
/// did not take.
const CONTROL_RETRY: Duration = Duration::from_micros(500);
/// Most VIs one NIC handle can hold.
pub const MAX_VI: usize = 1024;
/// Most CQs one NIC handle can hold.
pub const MAX_CQ: usize = 1024;
/// Largest CQ `CreateCQ` accepts.
pub const MAX_CQ_ENTRIES: usize = 1 << 20;
/// Most data segments one descriptor may have.
pub const MAX_SEGMENTS: usize = 252;
/// Largest message (MaxTransferSize) the engine supports.
pub const MAX_TRANSFER_SIZE: u32 = 16 << 20;

/// Tunables; [`Config::from_env`] reads `VIA_*` variables.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long a wait spins before sleeping on the device (`VIA_SPIN_US`).
    pub spin: Duration,
    /// First retransmission timeout (`VIA_RTO_US`).
    pub rto_initial: Duration,
    /// Largest retransmission timeout after backoff.
    pub rto_max: Duration,
    /// Timeouts without progress before the connection is declared lost
    /// (`VIA_RETRY_LIMIT`); with the two timeouts above it also fixes the
    /// time since the peer's last progress by which it is declared lost
    /// at the latest ([`Config::connection_timeout`]).
    pub retry_limit: u32,
    /// How long an ACK may wait for a frame to ride on.
    pub ack_delay: Duration,
    /// How long an ACK waits once the peer's frames stop coming
    /// (`VIA_ACK_IDLE_US`): a reply sent sooner carries it; a peer that
    /// sent and waits for its send to complete has it this soon after its
    /// last frame.
    pub ack_idle: Duration,
    /// An ACK goes out at least every this many accepted frames
    /// (`VIA_ACK_EVERY`); 0 takes an eighth of the window, at least 32
    /// ([`ack_every_for`]). The default, 32, also acknowledges a large
    /// message in the round that took it: a receiver that goes quiet right
    /// after (no progress thread nearby in time) still completes its
    /// peer's send. A program that always drives its engine (MTTL) can
    /// take 0.
    pub ack_every: u32,
    /// Depth of each work queue.
    pub queue_depth: usize,
    /// Run the background progress thread (`VIA_PROGRESS_THREAD=0` turns it off).
    pub progress_thread: bool,
    /// Receiver-not-ready mode (an extension; `VIA_RNR=1`): a message
    /// that finds no receive posted on a reliable VI is refused and the
    /// sender told so; it holds the message and sends it again after a
    /// back-off, instead of the connection breaking as VIA 1.0 has it.
    pub rnr: bool,
    /// Refusals in a row a sender takes before it gives up (the message
    /// completes with TRANSPORT_ERROR and the connection breaks):
    /// `VIA_RNR_RETRY`. With the back-off of [`RNR_BACKOFF`], the default
    /// waits about a second and a half in all.
    pub rnr_retry_limit: u32,
}

/// The back-off after a receiver-not-ready refusal: the first wait, and
/// the longest (each refusal in a row doubles it).
pub const RNR_BACKOFF: (Duration, Duration) = (Duration::from_micros(50), Duration::from_millis(10));

impl Default for Config {
    fn default() -> Self {
        Config {
            spin: Duration::from_micros(200),
            rto_initial: Duration::from_millis(2),
            rto_max: Duration::from_millis(250),
            retry_limit: 14,
            ack_delay: Duration::from_micros(200),
            ack_idle: Duration::from_micros(20),
            ack_every: 32,
            queue_depth: 1024,
            progress_thread: true,
            rnr: false,
            rnr_retry_limit: 160,
        }
    }
}

/// How many accepted frames an ACK may wait for, with `ack_every` 0, on a
/// link whose window is `window` frames: an eighth of it, at least 32. A
/// standalone ACK costs the receiver a trip through its device (over veth
/// a system call that also delivers the frame into the peer's ring, 1.5-3
/// us); where the window is wide (1,024 frames at MTU 1500), 32 asked for
/// one in the middle of most large messages, which the reply that follows
/// would have carried (MTTL's 56 KB exchange at MTU 1500: 36.4 -> 32.7 us
/// with 128). Where it is narrow the window's own ACK request
/// ([`via_wire::flags::ACK_REQ`] on the frame that fills it) still asks.
pub fn ack_every_for(window: u32) -> u32 {
    (window / 8).max(32)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

impl Config {
    pub fn from_env() -> Self {
        let mut c = Config::default();
        if let Some(v) = env_u64("VIA_SPIN_US") {
            c.spin = Duration::from_micros(v);
        }
        if let Some(v) = env_u64("VIA_ACK_IDLE_US") {
            c.ack_idle = Duration::from_micros(v);
        }
        if let Some(v) = env_u64("VIA_ACK_EVERY") {
            c.ack_every = u32::try_from(v).unwrap_or(u32::MAX); // 0: an eighth of the window
        }
        if let Some(v) = env_u64("VIA_RTO_US") {
            c.rto_initial = Duration::from_micros(v.max(10));
        }
        if let Some(v) = env_u64("VIA_RETRY_LIMIT") {
            c.retry_limit = v as u32;
        }
        if let Some(v) = env_u64("VIA_PROGRESS_THREAD") {
            c.progress_thread = v != 0;
        }
        if let Some(v) = env_u64("VIA_RNR") {
            c.rnr = v != 0;
        }
        if let Some(v) = env_u64("VIA_RNR_RETRY") {
            c.rnr_retry_limit = v as u32;
        }
        c
    }

    /// How long retransmission tries before giving up, counted from the
    /// peer's last progress: the backoff from the initial timeout through
    /// the retry limit. The timer gives up then at the latest, however far
    /// the round-trip estimate has raised its timeouts.
    pub fn connection_timeout(&self) -> Duration {
        let nanos = crate::vi::give_up_after(crate::clock::nanos_of(self.rto_initial), crate::clock::nanos_of(self.rto_max), self.retry_limit);
        Duration::from_nanos(nanos)
    }
}

/// Counters of the engine, readable through the API.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub tx_frames: u64,
    pub rx_frames: u64,
    pub retransmits: u64,
    pub rto_expiries: u64,
    pub acks_sent: u64,
    /// ACKs owed because `ack_every` frames came in order with none going
    /// back (not asked for by the sender, not timed; whether a standalone
    /// ACK or a frame of ours then carried it): the rule a reply that
    /// follows at once should leave idle.
    pub acks_by_count: u64,
    pub naks_sent: u64,
    pub tx_ring_full: u64,
    /// Sends that went boxed, and boxed messages placed here
    /// (`engine::boxed`).
    pub tx_boxed: u64,
    pub rx_boxed: u64,
    /// Middle fragments of a message placed on the short road
    /// (`engine::continuation`).
    pub rx_continued: u64,
    /// Reads of a placed word: what completes boxed sends when no reply
    /// said (`engine::boxed`).
    pub placed_reads: u64,
    pub rx_malformed: u64,
    pub rx_not_for_us: u64,
    pub rx_no_vi: u64,
    pub rx_stale: u64,
    /// Connection requests settled by the peer's first frame, before the
    /// program polled them (`engine::connect`).
    pub requests_settled_by_frame: u64,
    pub rx_duplicate: u64,
    pub rx_out_of_order: u64,
    pub rx_bad_offset: u64,
    pub rx_no_receive_posted: u64,
    pub length_errors: u64,
    pub connections_lost: u64,
    pub cq_overflows: u64,
    pub rdma_prot_errors: u64,
    pub read_responses_dropped: u64,
    /// Frames whose payload was copied straight from the sender's memory
    /// (lent by a process on this host).
    pub rx_lent: u64,
    /// Lent payloads that could not be read (the sender went away or no
    /// longer has the memory): the frame is dropped.
    pub rx_lent_failed: u64,
    /// Posts of a descriptor unchanged since its last post, which took
    /// what that post found valid instead of reading and checking it again
    /// ([`post::Kept`]).
    pub posts_kept: u64,
    /// Frames whose checksum was missing or wrong (corrupted on the way).
    pub rx_bad_checksum: u64,
    /// Frames taken without a CRC: their path cannot corrupt them (shared
    /// memory, a veth pair, a NIC's FCS or an offloaded UDP checksum).
    pub rx_unsealed: u64,
    /// Frames refused for their authentication: no tag, a wrong tag, or a
    /// tag where this host has no cluster secret ([`via_kernel_agent::auth`]).
    pub rx_bad_auth: u64,
    /// Frames whose tag was checked and good.
    pub rx_authenticated: u64,
    /// Frames whose tag was checked ahead, with the frame before them
    /// (four at a time, `authenticate::CheckedAhead`), good or not.
    pub rx_checked_ahead: u64,
    /// Frames an unreliable VI never received: gaps in its sequence.
    pub rx_lost: u64,
    /// Answers to our connection requests (accept, reject, pending, no
    /// match) from a host other than the one asked: dropped.
    pub rx_cm_foreign: u64,
    /// Broadcast name queries with an empty name: not answered.
    pub rx_query_refused: u64,
    /// Duplicate RDMA read requests served again (a response was lost).
    pub read_requests_replayed: u64,
    /// Duplicate RDMA read requests not served again: for no read we
    /// served, or past what the requester may still be missing.
    pub read_requests_stale: u64,
    /// The peer's remote atomics run on our memory (each once).
    pub atomics_served: u64,
    /// Duplicate atomic requests answered again from what the atomic
    /// gave the first time (it did not run again).
    pub atomics_replayed: u64,
    /// Receiver-not-ready: messages we refused for want of a receive, and
    /// refusals of ours the peer sent us.
    pub rnr_refused: u64,
    pub rnr_refusals_received: u64,
}

impl Counters {
    /// (name, value) pairs, for printing.
    pub fn pairs(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("tx_frames", self.tx_frames),
            ("rx_frames", self.rx_frames),
            ("retransmits", self.retransmits),
            ("rto_expiries", self.rto_expiries),
            ("acks_sent", self.acks_sent),
            ("acks_by_count", self.acks_by_count),
            ("naks_sent", self.naks_sent),
            ("tx_ring_full", self.tx_ring_full),
            ("tx_boxed", self.tx_boxed),
            ("rx_boxed", self.rx_boxed),
            ("rx_continued", self.rx_continued),
            ("placed_reads", self.placed_reads),
            ("rx_malformed", self.rx_malformed),
            ("rx_not_for_us", self.rx_not_for_us),
            ("rx_no_vi", self.rx_no_vi),
            ("rx_stale", self.rx_stale),
            ("requests_settled_by_frame", self.requests_settled_by_frame),
            ("rx_duplicate", self.rx_duplicate),
            ("rx_out_of_order", self.rx_out_of_order),
            ("rx_bad_offset", self.rx_bad_offset),
            ("rx_no_receive_posted", self.rx_no_receive_posted),
            ("length_errors", self.length_errors),
            ("connections_lost", self.connections_lost),
            ("cq_overflows", self.cq_overflows),
            ("rdma_prot_errors", self.rdma_prot_errors),
            ("read_responses_dropped", self.read_responses_dropped),
            ("rx_lent", self.rx_lent),
            ("rx_lent_failed", self.rx_lent_failed),
            ("posts_kept", self.posts_kept),
            ("rx_bad_checksum", self.rx_bad_checksum),
            ("rx_unsealed", self.rx_unsealed),
            ("rx_bad_auth", self.rx_bad_auth),
            ("rx_authenticated", self.rx_authenticated),
            ("rx_checked_ahead", self.rx_checked_ahead),
            ("rx_lost", self.rx_lost),
            ("rx_cm_foreign", self.rx_cm_foreign),
            ("rx_query_refused", self.rx_query_refused),
            ("read_requests_replayed", self.read_requests_replayed),
            ("read_requests_stale", self.read_requests_stale),
            ("atomics_served", self.atomics_served),
            ("atomics_replayed", self.atomics_replayed),
            ("rnr_refused", self.rnr_refused),
            ("rnr_refusals_received", self.rnr_refusals_received),
        ]
    }
}

/// An asynchronous error (what `VipErrorCallback` reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncError {
    pub vi: u16,
    pub kind: AsyncErrorKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncErrorKind {
    /// The connection broke (retries exhausted, or the peer disconnected).
    ConnLost,
    /// A message arrived for a reliable VI with no receive posted.
    RecvQueueEmpty,
    /// The peer's RDMA write broke our protection (ptag, bounds, enable bits).
    RdmaWriteProt,
    /// The peer's RDMA read broke our protection.
    RdmaReadProt,
    /// Completion queue `cq` went past its `entries` (what VIA calls a
    /// catastrophic CQ error). Reported once each time it goes past; no
    /// completion is dropped: the queue keeps them, and `VipResizeCQ` can
    /// make room.
    CqOverflow { cq: u16, entries: usize },
}

/// Everything a VI's processing may touch besides the VI itself: memory,
/// completion queues, the outbox (doorbell, ACKs due, error reports,
/// connection-management frames), counters, timers, configuration. The
/// engine's VI functions take `(&mut Context, &mut ViState)`: one VI
/// looked up once, everything else beside it.
pub struct Context {
    pub mac: MacAddr,
    /// Our endpoint id: what our frames' `dst_ep` must say.
    pub ep: u32,
    pub mtu: usize,
    /// Frames carry a checksum, and received ones must (the device cannot
    /// vouch for what it delivers: no Ethernet FCS check).
    pub checksum: bool,
    /// The device may deliver a peer's frames out of order (striping): a
    /// gap is NAKed only if it still stands at the delayed-ACK deadline.
    pub reorders: bool,
    /// The cluster secret's keys, when one is configured (`VIA_SECRET`):
    /// every frame then carries a MAC in place of the checksum.
    pub auth: Option<Keyring>,
    /// Payload bytes per fragment.
    pub frag: u32,
    /// Most unacknowledged frames per reliable VI.
    pub window: u32,
    /// When this engine's receivers acknowledge (from `config`).
    pub ack_timing: crate::vi::AckTiming,
    pub config: Config,
    pub mem: RegistrationTable,
    pub cm: ConnectionManager,
    pub peers: PeerConnector,
    /// Name discovery on the segment (asking and answering).
    pub resolver: Resolver,
    pub cqs: Vec<Option<CompletionQueue>>,
    /// Shared receive queues ([`srq`]).
    pub srqs: Vec<Option<srq::SharedReceiveQueue>>,
    /// What the VIs have to send: doorbell, ACKs owed, error reports.
    pub outbox: Outbox,
    /// Earliest armed VI timer (a lower bound; re-derived when reached).
    pub timer_at: Option<Time>,
    /// Boxed sends out on all VIs, or more (`engine::boxed`): while not
    /// 0, a round of progress at `settle_at` or later looks whether their
    /// peers placed them.
    pub boxes_out: u32,
    /// When a round of progress next reads the placed words of the boxed
    /// sends out ([`boxed::SETTLE_AFTER_NS`] after it last did, or after
    /// the first went out).
    pub settle_at: Time,
    /// Polls for a completed send that found none since the last boxed
    /// send (`engine::boxed`): the second one reads the placed words.
    pub box_polls: u32,
    /// A VI may hold a placed count told and not yet settled
    /// (`Sender::placed_told`): a CQ poll that finds nothing settles them.
    pub told_pending: bool,
    pub counters: Counters,
    /// The clock, read at most about once a microsecond ([`Clock`]).
    pub clock: Clock,
    pub async_errors: Vec<AsyncError>,
    /// Posted descriptors (on any queue) waiting to complete with the error
    /// found when they were posted.
    pub pre_errored: usize,
    /// What recent posts found valid, for descriptors posted again
    /// unchanged ([`post::Kept`]).
    pub kept: post::Kept,
    /// Bounce slots for fragments that gather too many pieces, and
    /// control-frame payloads; allocated once, on first use.
    pub(super) bounce: Vec<u8>,
    pub(super) ready: Vec<u16>,
    /// Verdicts on the tags of frames checked ahead with an earlier one.
    pub(crate) checked_ahead: authenticate::CheckedAhead,
}

/// Everything of an opened NIC except the device: the VIs, and the
/// [`Context`] they are processed in.
pub struct Core {
    pub vis: Vec<Option<ViState>>,
    pub cx: Context,
}

impl std::ops::Deref for Core {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.cx
    }
}

impl std::ops::DerefMut for Core {
    fn deref_mut(&mut self) -> &mut Context {
        &mut self.cx
    }
}

/// An opened NIC: the device plus the engine state.
pub struct Engine {
    pub dev: Box<dyn FrameDevice>,
    pub core: Core,
    /// Header slots of the batch being built (apart from `core`, so the
    /// device can read them while the core is updated).
    hdrs: Box<transmit::Headers>,
    /// Where each frame of the batch being built takes its payload from.
    specs: Box<[transmit::Spec; BATCH]>,
    /// The device does work for its peers each round (`serve_peers`).
    serves_peers: bool,
}

impl Engine {
    /// Takes over `dev`: picks an endpoint id and installs the receive filter.
    pub fn new(mut dev: Box<dyn FrameDevice>, config: Config) -> Result<Engine> {
        let mtu = dev.mtu();
        if mtu < VIA_HEADER_LEN + 64 {
            return Err(ViaError::resource(format!("device MTU {mtu} is too small for VIA (need at least {})", VIA_HEADER_LEN + 64)));
        }
        let auth = ClusterSecret::from_env().map_err(|e| ViaError::new(crate::VipReturn::InvalidParameter, e.to_string()))?.map(Keyring::new);
        let ep = loop {
            let e = random_u32();
            if e != ANY_ENDPOINT {
                break e;
            }
        };
        dev.set_filter(RxFilter { ethertype: ETHERTYPE, offset: DST_EP_OFFSET, accept: [ep, ANY_ENDPOINT] })
            .map_err(|e| ViaError::io("installing the receive filter", e))?;
        let mac = dev.mac();
        // An authenticated frame carries its tag after the payload.
        let frag = (mtu - VIA_HEADER_LEN - if auth.is_some() { via_wire::TAG_LEN } else { 0 }) as u32;
        // At most what the peer's reorder buffer spans, so that selective
        // repeat covers every frame in flight.
        let window = ((2 << 20) / mtu as u32).clamp(16, crate::reorder::REORDER_SPAN);
        // A NIC that drops what its ring of descriptors cannot hold: at
        // most half of it (the peer's taken to be like ours), so that a
        // window and what goes again after a timeout fit.
        let window = dev.rx_ring_frames().map_or(window, |r| window.min((r / 2) as u32).max(16));
        let mut config = config;
        if config.ack_every == 0 {
            config.ack_every = ack_every_for(window);
        }
        let caps = dev.capabilities();
        let checksum = !caps.checksummed;
        let cx = Context {
            mac,
            ep,
            mtu,
            checksum,
            reorders: caps.reorders,
            auth,
            checked_ahead: Default::default(),
            frag,
            window,
            ack_timing: crate::vi::AckTiming::new(config.ack_every, config.ack_delay, config.ack_idle),
            cm: ConnectionManager::new(mac, ep),
            peers: PeerConnector::new(mac, ep),
            resolver: Resolver::new(default_local_names(&NameService::load_default().unwrap_or_default(), mac)),
            config,
            mem: RegistrationTable::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            outbox: Outbox::default(),
            timer_at: None,
            boxes_out: 0,
            settle_at: Time::default(),
            box_polls: 0,
            told_pending: false,
            counters: Counters::default(),
            clock: Clock::default(),
            async_errors: Vec::new(),
            pre_errored: 0,
            kept: post::Kept::default(),
            bounce: Vec::new(),
            ready: Vec::new(),
        };
        let core = Core { vis: Vec::new(), cx };
        Ok(Engine { dev, core, hdrs: Box::new([[0u8; FRAME_HEADER_LEN]; BATCH]), specs: Box::new([transmit::Spec::default(); BATCH]), serves_peers: caps.serves_peers })
    }

    /// Registers memory and makes it reachable by the device (an IOMMU
    /// mapping on VFIO NICs); undoes the registration if mapping fails.
    pub fn register_memory(&mut self, addr: usize, len: usize, attrs: via_kernel_agent::memory::MemAttributes) -> Result<u32> {
        let handle = self.core.mem.register(addr, len, attrs).map_err(|e| match e {
            via_kernel_agent::memory::MemError::BadPtag => ViaError::new(crate::VipReturn::InvalidPtag, "unknown protection tag"),
            e => e.into(),
        })?;
        if let Err(e) = self.dev.map_memory(addr, len) {
            let _ = self.core.mem.deregister(addr, handle);
            return Err(ViaError::new(crate::VipReturn::ErrorResource, format!("mapping {len} bytes at {addr:#x} for the NIC: {e}")));
        }
        Ok(handle)
    }

    /// Deregisters memory; the device's access ends before this returns.
    pub fn deregister_memory(&mut self, addr: usize, handle: u32) -> Result<()> {
        let r = self.core.mem.deregister(addr, handle)?;
        self.dev.unmap_memory(r.addr, r.len).map_err(|e| ViaError::new(crate::VipReturn::ErrorResource, format!("unmapping {:#x}+{} from the NIC: {e}", r.addr, r.len)))
    }

    /// The device's own counters (tests; the API asks the device through
    /// the NIC).
    #[cfg(feature = "test-support")]
    pub fn device_stats(&self) -> Vec<(&'static str, u64)> {
        self.dev.stats()
    }

    pub fn wait_fd(&self) -> RawFd {
        self.dev.wait_fd()
    }

    /// A thread is about to sleep on [`Engine::wait_fd`]: `None` when
    /// frames came meanwhile, or the sleep to drop once it woke (see
    /// `FrameDevice::prepare_sleep`).
    pub fn prepare_sleep(&mut self) -> Option<via_device::Sleep> {
        self.dev.prepare_sleep()
    }

    /// Where the device's next frame will show (`via_device::watch`),
    /// as of now.
    pub fn rx_watch(&self, w: &mut via_device::RxWatches) {
        self.dev.rx_watch(w);
    }

    /// Nothing waits to be transmitted: only a frame (or a timer) can
    /// give this engine work.
    pub fn idle(&mut self) -> bool {
        self.core.nothing_queued()
    }

    /// Would a round of progress at `now` do nothing? True when the
    /// device can say where its next frame will show and none is there,
    /// nothing waits to go out and no timer is due; a poll that finds
    /// nothing complete then skips the round.
    pub fn quiet(&mut self, now: Time) -> bool {
        if !(self.idle() && self.core.timers_quiet(now)) {
            return false;
        }
        self.dev.rx_pending() == Some(false)
    }

    /// One round of work: receive, timers, transmit. Returns true when
    /// anything was received. (Tests; the API runs rounds with the time
    /// it has read, [`Engine::progress_at`].)
    #[cfg(feature = "test-support")]
    pub fn progress(&mut self) -> bool {
        let now = self.core.clock.now();
        self.progress_at(now)
    }

    /// [`Engine::progress`] with the time already read.
    pub fn progress_at(&mut self, now: Time) -> bool {
        via_device::probe::mark(via_device::probe::Stage::Round);
        let Engine { dev, core, serves_peers, .. } = self;
        // Our share of copies our receivers posted (work, as frames are).
        let mut got = if *serves_peers { dev.serve_peers() } else { 0 };
        for _ in 0..4 {
            let n = dev.receive_lent(64, &mut |f, meta| core.on_frame(f, meta, now)).unwrap_or(0);
            if n != 0 {
                // Verdicts kept for frames of this delivery end with it.
                core.cx.checked_ahead.clear();
            }
            got += n;
            if n < 64 {
                break;
            }
        }
        if core.cx.boxes_out != 0 && now >= core.cx.settle_at {
            core.settle_all_boxes(now);
        }
        core.run_timers(now);
        self.flush(now);
        got > 0
    }

    /// `VipPostSend` that transmits at once: the send's frames leave
    /// before this returns (unless the window is closed or the device
    /// full: then with later progress).
    pub fn post_send(&mut self, id: u16, addr: usize, handle: u32) -> Result<()> {
        if self.core.post_unrung(id, addr, handle, post::Queue::Send)? {
            via_device::probe::mark(via_device::probe::Stage::Validated);
            self.transmit_now(id);
        }
        Ok(())
    }

    /// Transmits what the doorbell and the ACK scheduler queued, without
    /// receiving or running timers: what posting a send needs at once.
    pub fn ring_doorbell(&mut self) {
        let now = self.core.clock.now();
        self.flush(now);
    }

    /// The next instant a timer needs the engine.
    pub fn next_deadline(&self) -> Option<Instant> {
        let c = &self.core;
        let vi_timers = c.timer_at.map(|t| c.clock.instant(t));
        // Control frames the device did not take: try again shortly.
        let unsent = c.cm.has_outgoing().then(|| Instant::now() + CONTROL_RETRY);
        [vi_timers, c.cm.next_deadline(), c.peers.next_deadline(), c.resolver.next_deadline(), unsent].into_iter().flatten().min()
    }
}

/// VI `id` of `vis`, borrowing only the VI table (so counters and config
/// stay usable alongside).
pub(crate) fn vi_at(vis: &mut [Option<ViState>], id: u16) -> Option<&mut ViState> {
    vis.get_mut((id as usize).wrapping_sub(1)).and_then(Option::as_mut)
}

/// The first free slot of `table` (a new one at its end while it holds
/// fewer than `max`): where a VI, CQ or shared receive queue is created.
pub(crate) fn vacant_slot<T>(table: &mut Vec<Option<T>>, max: usize) -> Option<usize> {
    if let Some(s) = table.iter().position(Option::is_none) {
        return Some(s);
    }
    (table.len() < max).then(|| {
        table.push(None);
        table.len() - 1
    })
}

/// The error for a VI handle that names no VI.
#[cold]
pub(crate) fn no_vi(id: u16) -> ViaError {
    ViaError::invalid(format!("no VI with handle {id}"))
}

impl Core {
    /// VI `id` and the context it is processed in.
    #[inline]
    pub(crate) fn split(&mut self, id: u16) -> Option<(&mut Context, &mut ViState)> {
        let vi = vi_at(&mut self.vis, id)?;
        Some((&mut self.cx, vi))
    }

    #[inline]
    pub fn vi(&self, id: u16) -> Result<&ViState> {
        self.vis.get((id as usize).wrapping_sub(1)).and_then(Option::as_ref).ok_or_else(|| no_vi(id))
    }

    pub fn vi_mut(&mut self, id: u16) -> Result<&mut ViState> {
        self.vis.get_mut((id as usize).wrapping_sub(1)).and_then(Option::as_mut).ok_or_else(|| no_vi(id))
    }

    /// The checks of VI attributes that need no VI.
    fn check_vi_attributes(attrs: &ViAttributes) -> Result<()> {
        if attrs.max_transfer_size > MAX_TRANSFER_SIZE {
            return Err(ViaError::new(crate::VipReturn::InvalidMtu, format!("MaxTransferSize {} exceeds the NIC's {}", attrs.max_transfer_size, MAX_TRANSFER_SIZE)));
        }
        if attrs.enable_rdma_read && !attrs.reliability.is_reliable() {
            return Err(ViaError::new(crate::VipReturn::InvalidRdmaRead, "RDMA read needs a reliable level (RDMAReadSupport is Reliable Delivery and Reliable Reception)"));
        }
        Ok(())
    }

    /// `VipSetViAttributes` on VI `id`.
    pub fn set_vi_attributes(&mut self, id: u16, attrs: ViAttributes) -> Result<()> {
        Self::check_vi_attributes(&attrs)?;
        let old = self.vi(id)?.attrs;
        let idle = self.vi(id)?.phase == ViPhase::Idle;
        if !idle && (attrs.reliability != old.reliability || attrs.max_transfer_size != old.max_transfer_size) {
            return Err(ViaError::state("the reliability level and MaxTransferSize change only while the VI is idle"));
        }
        if attrs.ptag != old.ptag {
            self.mem.acquire_ptag(attrs.ptag).map_err(|_| ViaError::new(crate::VipReturn::InvalidPtag, "unknown protection tag"))?;
            self.mem.release_ptag(old.ptag);
            self.mem.invalidate_checks(); // posted descriptors were checked against the old tag
        }
        let vi = self.vi_mut(id)?;
        if attrs != vi.attrs {
            vi.attrs = attrs;
            vi.rules = crate::workqueue::next_serial(); // kept records made under the old ones stand no more
        }
        Ok(())
    }

    /// Creates a VI; its CQs (if any) must exist.
    pub fn create_vi(&mut self, attrs: ViAttributes, send_cq: Option<u16>, recv_cq: Option<u16>) -> Result<u16> {
        for cq in [send_cq, recv_cq].into_iter().flatten() {
            self.cq_mut(cq)?;
        }
        Self::check_vi_attributes(&attrs)?;
        self.mem.acquire_ptag(attrs.ptag).map_err(|_| ViaError::new(crate::VipReturn::InvalidPtag, "unknown protection tag"))?;
        let Some(slot) = vacant_slot(&mut self.vis, MAX_VI) else {
            self.mem.release_ptag(attrs.ptag);
            return Err(ViaError::resource(format!("too many VIs (MaxVI = {MAX_VI})")));
        };
        self.vis[slot] = Some(ViState::new(slot as u16 + 1, attrs, send_cq, recv_cq, self.config.queue_depth, (self.config.rto_initial, self.config.rto_max)));
        Ok(slot as u16 + 1)
    }

    /// Destroys a VI. Connected VIs are disconnected first and everything
    /// posted completes as flushed (the completions are discarded with it).
    pub fn destroy_vi(&mut self, id: u16) -> Result<()> {
        self.vi(id)?;
        if matches!(self.vi(id)?.phase, ViPhase::Connected | ViPhase::ConnectPending) {
            self.disconnect(id)?;
        }
        self.vi_leave_srq(id);
        let vi = self.vis[id as usize - 1].take().unwrap();
        self.mem.release_ptag(vi.attrs.ptag);
        self.cm.forget_vi(id);
        self.peers.cancel(id);
        if let Some(k) = self.auth.as_mut() {
            k.clear_vi(id);
        }
        for cq in [vi.send_cq, vi.recv_cq].into_iter().flatten() {
            if let Ok(c) = self.cq_mut(cq) {
                c.forget_vi(id);
            }
        }
        self.outbox.forget_vi(id);
        Ok(())
    }

    pub fn create_cq(&mut self, entries: usize) -> Result<u16> {
        if entries == 0 || entries > MAX_CQ_ENTRIES {
            return Err(ViaError::invalid(format!("a CQ has 1 to {} entries, not {entries}", MAX_CQ_ENTRIES)));
        }
        let Some(slot) = vacant_slot(&mut self.cqs, MAX_CQ) else {
            return Err(ViaError::resource(format!("too many CQs (MaxCQ = {MAX_CQ})")));
        };
        self.cqs[slot] = Some(CompletionQueue::new(entries));
        Ok(slot as u16 + 1)
    }

    pub fn destroy_cq(&mut self, id: u16) -> Result<()> {
        self.cq_mut(id)?;
        if self.vis.iter().flatten().any(|v| v.send_cq == Some(id) || v.recv_cq == Some(id)) {
            return Err(ViaError::state("CQ is still associated with a VI"));
        }
        self.cqs[id as usize - 1] = None;
        Ok(())
    }
}

impl Context {
    pub fn cq_mut(&mut self, id: u16) -> Result<&mut CompletionQueue> {
        self.cqs.get_mut((id as usize).wrapping_sub(1)).and_then(Option::as_mut).ok_or_else(|| ViaError::invalid(format!("no CQ with handle {id}")))
    }

    /// Arms the engine-wide timer no later than `t`.
    pub fn arm(&mut self, t: Time) {
        self.timer_at = Some(self.timer_at.map_or(t, |x| x.min(t)));
    }
}
