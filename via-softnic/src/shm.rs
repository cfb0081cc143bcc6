//! [`ShmDevice`] (driver `shm`): a frame device between processes of one
//! host, through a shared-memory segment instead of a NIC.
//!
//! The segment `/dev/shm/via-shm-<wire>` holds a header and [`PORTS`]
//! ports. A process attaches by claiming a free port (or one whose owner
//! died) and publishing its identity there: the MAC address it answers to
//! (the NIC's, when the device is part of a composite) and its receive
//! filter. Each port has one receive ring of [`SLOTS`] fixed-size slots:
//! any process may append under the port's lock (a word holding the
//! holder's pid, so that a holder that died can be overruled), only the
//! owner takes frames out, in place, without a lock. A frame goes to every
//! port whose identity is the frame's destination (all others, for
//! broadcast) and whose filter accepts it. A full ring refuses the frame,
//! and the engine sends it again later: nothing is dropped for lack of room.
//! The refused sender marks itself in the ring's `blocked` mask, and the
//! owner rings its doorbell once it has taken frames out, so a sender
//! asleep waiting for room wakes when there is some.
//!
//! Waking: each port's owner sleeps on an eventfd (its `wait_fd`), whose
//! number it publishes in the port's control block; a sender takes its
//! own copy of it once, with `pidfd_getfd` (the owner allows that with
//! `PR_SET_PTRACER`, for kernels whose Yama policy asks). While the owner
//! spins, nobody makes a system call: a thread of the owner about to sleep
//! first counts itself in the port's `sleepers`, then looks at the ring
//! once more (the tail, [`FrameDevice::prepare_sleep`]: it does not sleep
//! if frames came). A sender publishes its frame (the slot's sequence
//! word, then the tail), then rings the eventfd only if `sleepers` is not
//! 0, and only once until the owner empties it (`rung`). Each side's
//! store and then look are sequentially consistent operations, so of the
//! sender's look at `sleepers` and the owner's look at the tail one sees
//! the other's store:
//! a frame is either seen before sleeping or wakes the sleeper. The owner
//! empties the eventfd when it finds the ring empty with `rung` set, then
//! clears `rung` and looks once more. (No fence does this: on x86 a
//! sequentially consistent store is an `xchg`, about 2 ns here, where the
//! `mfence` of `fence(SeqCst)` took about 16, on every message.)
//!
//! Lending (`shm:<wire>,lend=<bytes>`): a frame whose payload its sender
//! keeps in place until the receiver has it ([`TxFrame::lendable`]) and
//! that is at least `<bytes>` long goes into the ring as its headers and a
//! [`LentPayload`] record (the sender's pid and the pieces' addresses);
//! the receiver copies the payload once, with `process_vm_readv`, straight
//! into its destination ([`FrameDevice::receive_lent`]). A lent frame is
//! not bound by the MTU, and the engine sends a message the path lends
//! whole, as one frame ([`via_device::Path::lends_from`]): the receiver
//! reads it with one system call, or, for two chunks or more, shares the
//! copy with the sender, which writes its chunks from the back while the
//! receiver reads from the front (`shared_copies`,
//! [`via_device::shared_copy`]). By default payloads of 64 KiB and more
//! are lent ([`LEND_MIN_DEFAULT`]), where the kernel lets processes of one
//! user read each other's memory; below that the two copies through the
//! ring, which the two ends make side by side, move more. Slots are large
//! enough for any frame up to the MTU (64 KiB), so frames that are not
//! lent are copied whole.
//!
//! Boxed messages (`via_device::boxed`): a one-frame send of the engine's
//! to a process on the wire may go as a record of its own in the same
//! ring ([`ShmDevice::transmit_boxed`], its length word flagged `BOXED`),
//! handed up with the word in which the receiver says it placed it (one
//! per sending port and VI, after the ports: `Segment::placed`).
//!
//! Who may join: the segment is made owner-only, and one made by anyone
//! else (another user, a symbolic link) is refused (`segment`). A lent
//! record is read only if its pid owns a live port of the wire and the
//! kernel gives that process our uid; a doorbell is copied and rung only
//! under the same condition, and only if it is an eventfd (`members`):
//! records that fail are counted (`shm_rx_lent_refused`) and dropped,
//! never read. Wire names should be hard to guess (see
//! [`unguessable_suffix`]), so that nobody makes the file first.
//!
//! Memory errors are not a concern between processes of one host, so the
//! device reports itself checksummed.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use via_device::MAX_GATHER;
use via_device::SharedCopy;
use via_device::ETH_HEADER_LEN;
use via_device::boxed::{BOX_PORT_OFFSET, BOX_SRC_VI_OFFSET};
use via_device::{BoxRoute, Capabilities, EventFd, FrameDevice, LentPayload, MacAddr, Path, PlacedWord, RxFilter, RxMeta, RxWatch, RxWatches, Sleep, TxFrame, BOX_HEADER_LEN};

mod line_hints;
mod members;
mod payload_copy;
mod segment;
mod shared_copies;

use line_hints::LineHints;
use members::Members;
use payload_copy::{PayloadCopy, Policy, ReadTimer};
use segment::{alive, Segment, BOX_VIS, CLAIMED, FREE, LIVE, SLOT_BYTES, SLOT_PREFIX};

/// Ports of a segment: processes attached at once.
pub const PORTS: usize = 64;
/// Slots of a port's receive ring.
pub const SLOTS: u64 = 128;
/// The device's MTU: 64 KiB slots, so that the VIA header's 16-bit
/// payload length is the limit, not the wire.
pub const MTU: usize = 65472;
/// The length word's flag for a lent frame: the headers are followed, at
/// the next 8-byte boundary, by the sender's pid (u32), the piece count
/// (u32) and each piece's address and length (u64 each).
const LENT: u64 = 1 << 63;
/// The length word's flag for a boxed message (`via_device::boxed`): a
/// header of its own and the payload, not a frame.
const BOXED: u64 = 1 << 62;
/// A frame's length word flag: its payload was written with streaming
/// stores (`payload_copy`; the receiver times such frames apart).
const STREAMED: u64 = 1 << 61;
/// The length word's flags: what is left is the length.
const LENGTH_FLAGS: u64 = LENT | BOXED | STREAMED;

fn mac_word(m: MacAddr) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&m.0);
    u64::from_le_bytes(b)
}

/// What the ports a frame goes to depend on: its destination, its
/// ethertype and the words the candidate ports' filters look at. A frame
/// that agrees with the last one there goes where it went (checked in a
/// few compares, where the frame's whole start changes with every frame).
#[derive(Default)]
struct TargetKey {
    /// Nothing found yet (or the wire changed): matches nothing.
    valid: bool,
    dst: [u8; 6],
    ethertype: [u8; 2],
    /// (offset, the word there, if the frame reached it), one per offset.
    words: Vec<(usize, Option<[u8; 4]>)>,
}

impl TargetKey {
    fn word(head: &[u8], at: usize) -> Option<[u8; 4]> {
        head.get(at..at + 4).map(|w| w.try_into().unwrap())
    }

    #[inline]
    fn matches(&self, head: &[u8]) -> bool {
        self.valid && head.len() >= ETH_HEADER_LEN && head[..6] == self.dst && head[12..14] == self.ethertype && self.words.iter().all(|&(at, w)| Self::word(head, at) == w)
    }

    /// Records `head`'s deciding bytes for the ports whose `filters`
    /// were consulted.
    fn set(&mut self, head: &[u8], filters: impl Iterator<Item = RxFilter>) {
        self.valid = head.len() >= ETH_HEADER_LEN;
        if !self.valid {
            return;
        }
        self.dst.copy_from_slice(&head[..6]);
        self.ethertype.copy_from_slice(&head[12..14]);
        self.words.clear();
        for f in filters {
            if !self.words.iter().any(|&(at, _)| at == f.offset) {
                self.words.push((f.offset, Self::word(head, f.offset)));
            }
        }
    }
}

/// A live port as a sender sees it.
#[derive(Clone, Copy)]
struct Route {
    port: usize,
    generation: u32,
    filter: Option<RxFilter>,
}

/// What [`ShmDevice::reserve`] found in a port's ring.
enum Reserved {
    /// Slot `tail` is ours to write, under the port's lock.
    Slot(u64),
    /// The port changed hands since the route was found.
    Gone,
    /// No room.
    Full,
}

/// A process's port on a shared-memory wire.
pub struct ShmDevice {
    /// Shared with the sleeps handed out (a sleeper says it woke without
    /// the device).
    seg: std::sync::Arc<Segment>,
    wire: String,
    port: usize,
    pid: u32,
    identity: MacAddr,
    /// Our ring's next index to take (its `head`, which only we write).
    rx_head: u64,
    /// Our eventfd: the wait descriptor.
    wake: EventFd,
    /// Live ports by identity, as of `epoch` (a few: looked through in
    /// order, no hashing per frame).
    routes: Vec<(MacAddr, Vec<Route>)>,
    epoch: u64,
    /// Other ports' eventfds (our copies), with their generation, by port.
    doorbells: Vec<Option<(u32, EventFd)>>,
    /// The ports of the frame being sent (kept for reuse), and what they
    /// were found for.
    targets: Vec<Route>,
    found_for: TargetKey,
    /// Payloads at least this long are lent (usize::MAX: never).
    lend_min: usize,
    /// How large payloads are copied into a slot (through the cache or
    /// around it).
    payload_copy: PayloadCopy,
    /// The cache-line hints this processor has (none if turned off).
    hints: LineHints,
    /// What taking large frames costs us, published in our port's
    /// control block for the senders.
    read_timer: ReadTimer,
    /// Where plain `receive` reads a lent frame in whole.
    scratch: Vec<u8>,
    /// Numbers our lent records (`shared_copies`).
    records: shared_copies::RecordCount,
    /// Chunks of our lent payloads we wrote for their receivers.
    chunks_written: u64,
    /// The processes whose lent payloads and doorbells we use.
    members: Members,
    rx_frames: u64,
    tx_frames: u64,
    tx_lent: u64,
    tx_boxed: u64,
    rx_boxed: u64,
    tx_ring_full: u64,
    tx_no_port: u64,
    /// Frames refused for their length (longer than a slot takes).
    tx_oversize: u64,
    rx_bad_length: u64,
    rx_lent_failed: u64,
    rx_lent_refused: u64,
    doorbell_failed: u64,
    /// Doorbells rung (system calls made to wake another port's owner).
    doorbells_rung: u64,
}

impl std::fmt::Debug for ShmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDevice").field("wire", &self.wire).field("port", &self.port).field("identity", &self.identity).finish_non_exhaustive()
    }
}

/// The segment's path for `wire`.
pub fn segment_path(wire: &str) -> String {
    format!("/dev/shm/via-shm-{wire}")
}

/// 16 hex digits from the kernel's random source (`getrandom`, or
/// `/dev/urandom` where that call is missing): a wire name's suffix that
/// no other user can guess and make the segment of first.
pub fn unguessable_suffix() -> io::Result<String> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the live buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        use std::io::Read;
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    }
    Ok(format!("{:016x}", u64::from_ne_bytes(b)))
}

/// Removes the wire's segment: for whoever made the wire, once every
/// process is done with it. Processes still attached keep their mappings;
/// new ones get a fresh segment.
pub fn remove_wire(wire: &str) {
    let _ = std::fs::remove_file(segment_path(wire));
}

/// Lendable payloads of at least this many bytes are lent unless the
/// wire's name says otherwise (`lend=`), where this process may read
/// another's memory (`sys::lending_possible`). A message longer than a
/// frame then goes whole, read by the receiver with one system call (from
/// two chunks on, copied by both ends: `shared_copies`): from 64 KiB on
/// that took 0.5-0.6 of the time of the two copies through the ring, and
/// moved 1.1-1.5x the bytes a second read whole, 2.5-3x at 1 MiB shared
/// (docs/BENCHMARKS.md). Below, the copies, which the two cores make side
/// by side, move more.
pub const LEND_MIN_DEFAULT: usize = 65536;

/// Does this process lend by default ([`LEND_MIN_DEFAULT`]): may processes
/// of its user read each other's memory here?
pub fn lending_possible() -> bool {
    sys::lending_possible()
}

/// What a wire's name says: `<wire>[,lend=<bytes>|off][,copy=timed|cached|streaming][,hints=on|off]`.
struct Spec<'a> {
    wire: &'a str,
    /// Lendable payloads of at least this many bytes are lent.
    lend_min: usize,
    /// How large payloads are copied into the ring.
    copy: Policy,
    /// Whether small frames' cache lines are hinted (`line_hints`).
    hints: bool,
}

fn parse_spec(spec: &str) -> io::Result<Spec<'_>> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("shm wire {spec:?}: {why}"));
    let (wire, opts) = spec.split_once(',').unwrap_or((spec, ""));
    if wire.is_empty() || wire.contains('/') {
        return Err(bad("want a non-empty name without '/'".into()));
    }
    let lend_min = if lending_possible() { LEND_MIN_DEFAULT } else { usize::MAX };
    let mut out = Spec { wire, lend_min, copy: Policy::Timed, hints: true };
    for opt in opts.split(',').filter(|o| !o.is_empty()) {
        match opt.split_once('=') {
            Some(("lend", "off")) => out.lend_min = usize::MAX,
            Some(("lend", n)) => out.lend_min = n.parse().map_err(|_| bad(format!("lend={n}: want a byte count or off")))?,
            Some(("copy", v)) => out.copy = Policy::parse(v).ok_or_else(|| bad(format!("copy={v}: want timed, cached or streaming")))?,
            Some(("hints", "on")) => out.hints = true,
            Some(("hints", "off")) => out.hints = false,
            Some(("hints", v)) => return Err(bad(format!("hints={v}: want on or off"))),
            _ => return Err(bad(format!("unknown option {opt:?} (known: lend=<bytes>|off, copy=timed|cached|streaming, hints=on|off)"))),
        }
    }
    Ok(out)
}

impl ShmDevice {
    /// Attaches to the wire named by `spec`
    /// (`<wire>[,lend=<bytes>|off][,copy=timed|cached|streaming][,hints=on|off]`;
    /// made on first use) as `identity`, or as a fresh locally administered
    /// MAC. With `lend=<bytes>` lendable payloads of at least that many
    /// bytes are lent rather than copied (module comment; by default
    /// [`LEND_MIN_DEFAULT`], `lend=off` copies all); `copy=` says
    /// how large payloads are copied into the ring (`payload_copy`);
    /// `hints=off` leaves small frames' cache lines where they are
    /// (`line_hints`: on by default, where the processor has them).
    pub fn open(spec: &str, identity: Option<MacAddr>) -> io::Result<ShmDevice> {
        let Spec { wire, lend_min, copy, hints } = parse_spec(spec)?;
        let path = segment_path(wire);
        let seg = std::sync::Arc::new(Segment::open(&path).map_err(|e| io::Error::new(e.kind(), format!("opening the shared-memory segment {path}: {e}")))?);
        let pid = std::process::id();
        let identity = identity.unwrap_or_else(|| {
            let r = (pid as u64) << 16 ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
            let b = r.to_le_bytes();
            MacAddr([0x06, b[0], b[1], b[2], b[3], b[4]])
        });
        let port = (0..PORTS)
            .find(|&p| {
                let c = seg.control(p);
                let st = c.state.load(Ordering::Acquire);
                // A port being claimed (CLAIMED) is left alone even if its
                // claimer died: that leaks one port, never gives one twice.
                let claimable = st == FREE || (st == LIVE && !alive(c.pid.load(Ordering::Acquire)));
                claimable && c.state.compare_exchange(st, CLAIMED, Ordering::AcqRel, Ordering::Acquire).is_ok()
            })
            .ok_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, format!("all {PORTS} ports of {path} are taken by live processes")))?;
        // Reset the ring under its lock: a sender that was writing to the
        // port's previous owner finishes first.
        seg.lock(port, pid);
        let c = seg.control(port);
        c.pid.store(pid, Ordering::Release);
        c.mac.store(mac_word(identity), Ordering::Release);
        c.filter[0].store(0, Ordering::Release);
        // What the previous owner left unread is dropped. The indices go
        // on from where they were (never back to 0), so no slot's sequence
        // word can already say "published" at the new head.
        let rx_head = c.tail.load(Ordering::Acquire);
        c.head.store(rx_head, Ordering::Release);
        c.head_seen.store(rx_head, Ordering::Relaxed);
        c.rung.store(0, Ordering::Release);
        c.read_costs.clear();
        let generation = c.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        c.sleepers.store(u64::from(generation) << 32, Ordering::Release);
        seg.unlock(port);
        let wake = EventFd::new().map_err(|e| io::Error::new(e.kind(), format!("making the doorbell eventfd: {e}")))?;
        c.wake_fd.store(wake.as_raw_fd() as u32, Ordering::Release);
        sys::allow_fd_copies();
        c.state.store(LIVE, Ordering::Release);
        seg.header().epoch.fetch_add(1, Ordering::AcqRel);
        Ok(ShmDevice {
            seg,
            wire: wire.to_string(),
            port,
            pid,
            identity,
            rx_head,
            wake,
            routes: Vec::new(),
            epoch: u64::MAX,
            doorbells: (0..PORTS).map(|_| None).collect(),
            targets: Vec::new(),
            found_for: TargetKey::default(),
            lend_min,
            payload_copy: PayloadCopy::new(copy),
            hints: LineHints::detect(hints),
            read_timer: ReadTimer::default(),
            scratch: Vec::new(),
            records: shared_copies::RecordCount::new(port),
            chunks_written: 0,
            members: Members::new(),
            rx_frames: 0,
            tx_frames: 0,
            tx_lent: 0,
            tx_boxed: 0,
            rx_boxed: 0,
            tx_ring_full: 0,
            tx_no_port: 0,
            tx_oversize: 0,
            rx_bad_length: 0,
            rx_lent_failed: 0,
            rx_lent_refused: 0,
            doorbell_failed: 0,
            doorbells_rung: 0,
        })
    }

    /// The wire's name.
    pub fn wire_name(&self) -> &str {
        &self.wire
    }

    /// Rebuilds the identity → ports table if any port changed (the
    /// segment's `epoch`, as just read).
    fn refresh(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        self.routes.clear();
        for p in (0..PORTS).filter(|&p| p != self.port) {
            let c = self.seg.control(p);
            if c.state.load(Ordering::Acquire) != LIVE {
                continue;
            }
            let m = c.mac.load(Ordering::Acquire).to_le_bytes();
            let mac = MacAddr(m[..6].try_into().unwrap());
            let (f0, f1) = (c.filter[0].load(Ordering::Acquire), c.filter[1].load(Ordering::Acquire));
            let filter = ((f0 >> 32) != 0).then_some(RxFilter { ethertype: (f0 >> 32) as u16, offset: (f0 & 0xffff_ffff) as usize, accept: [f1 as u32, (f1 >> 32) as u32] });
            let route = Route { port: p, generation: c.generation.load(Ordering::Acquire), filter };
            match self.routes.iter_mut().find(|(m, _)| *m == mac) {
                Some((_, v)) => v.push(route),
                None => self.routes.push((mac, vec![route])),
            }
        }
        self.epoch = epoch;
    }

    /// Puts the ports a frame goes to (a broadcast: every other live
    /// port) in `self.targets`; `head` is the frame's start (its
    /// destination, ethertype and the word the filters look at).
    #[inline]
    fn find_targets(&mut self, head: &[u8]) {
        // The same deciding bytes as last time, with no port changed
        // since: the same ports (a composite asks `takes` and then sends).
        let epoch = self.seg.header().epoch.load(Ordering::Acquire);
        if epoch == self.epoch && self.found_for.matches(head) {
            return;
        }
        self.find_targets_again(head, epoch);
    }

    /// [`ShmDevice::find_targets`] for a frame unlike the last one, or
    /// after a port changed (`epoch`).
    #[cold]
    #[inline(never)]
    fn find_targets_again(&mut self, head: &[u8], epoch: u64) {
        self.refresh(epoch);
        let ShmDevice { routes, targets, found_for, .. } = self;
        targets.clear();
        let dst = MacAddr(head[..6].try_into().unwrap());
        let accepts = |r: &&Route| r.filter.is_none_or(|f| f.matches(head));
        // What decided it is kept: the next frame with the same bytes
        // there (most of a connection's frames) goes to the same ports.
        if dst.is_broadcast() {
            targets.extend(routes.iter().flat_map(|(_, v)| v).filter(accepts));
            found_for.set(head, routes.iter().flat_map(|(_, v)| v).filter_map(|r| r.filter));
        } else {
            let candidates = routes.iter().find(|(m, _)| *m == dst).map_or(&[][..], |(_, v)| v);
            targets.extend(candidates.iter().filter(accepts));
            found_for.set(head, candidates.iter().filter_map(|r| r.filter));
        }
    }

    /// Does a process on this wire take the frame starting with `head`
    /// (by its destination and filter)? A composite sends it here if so.
    pub fn takes(&mut self, head: &[u8]) -> bool {
        if head.len() < ETH_HEADER_LEN || MacAddr(head[..6].try_into().unwrap()).is_broadcast() {
            return false;
        }
        self.find_targets(head);
        !self.targets.is_empty()
    }

    /// Sends `f` if it is a unicast frame some process on this wire takes
    /// (what a composite would route here): Some(whether it went, or the
    /// ring was full), None when it is not for the wire.
    #[inline]
    pub fn transmit_taken(&mut self, f: &TxFrame<'_>) -> Option<io::Result<bool>> {
        let mut copy = [0u8; 64];
        let head = match self.checked_start(0, f, &mut copy) {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        if MacAddr(head[..6].try_into().unwrap()).is_broadcast() {
            return None;
        }
        self.find_targets(head);
        if self.targets.is_empty() {
            return None;
        }
        Some(Ok(self.send_to_targets(f, false)))
    }

    /// Where VI `vi`'s boxed messages to the one process that takes frames
    /// starting with `head` go, if exactly one does (`via_device::boxed`).
    pub fn box_route(&mut self, head: &[u8], vi: u16) -> Option<BoxRoute> {
        if head.len() < ETH_HEADER_LEN || MacAddr(head[..6].try_into().unwrap()).is_broadcast() || usize::from(vi) >= BOX_VIS {
            return None;
        }
        self.find_targets(head);
        let [r] = self.targets[..] else { return None };
        // SAFETY: the word lies in the segment, which the device holds
        // (an `Arc`) for as long as it lives.
        let placed = unsafe { PlacedWord::new(self.seg.placed(self.port, usize::from(vi))) };
        // A payload the wire would lend goes as a frame, lent.
        let max_len = self.lend_min.saturating_sub(1).min(MTU - BOX_HEADER_LEN) as u32;
        Some(BoxRoute { port: r.port as u32, generation: r.generation, placed, max_len })
    }

    /// Appends a boxed message to `route`'s ring (the header gets our
    /// port); false if the ring is full. A port that changed hands since
    /// the route was found takes it into the void, as it would a frame.
    /// A message longer than a slot holds is refused with an error.
    #[inline(always)]
    pub fn transmit_boxed(&mut self, route: &BoxRoute, header: &[u8; BOX_HEADER_LEN], payload: &[u8]) -> io::Result<bool> {
        if payload.len() > MTU + ETH_HEADER_LEN - BOX_HEADER_LEN {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a boxed message of {} bytes; shm wire {:?} boxes at most {}", payload.len(), self.wire, MTU + ETH_HEADER_LEN - BOX_HEADER_LEN)));
        }
        let r = Route { port: route.port as usize, generation: route.generation, filter: None };
        let tail = match self.reserve(r) {
            Reserved::Slot(tail) => tail,
            Reserved::Gone => {
                self.tx_boxed += 1; // into the void, as a frame would go
                return Ok(true);
            }
            Reserved::Full => {
                self.tx_ring_full += 1;
                return Ok(false);
            }
        };
        let s = self.seg.slot(r.port, tail).wrapping_add(SLOT_PREFIX - 8);
        let port = (self.port as u16).to_le_bytes();
        // SAFETY: slot `tail` is ours to write until published (`reserve`);
        // the length word, the header and the payload (checked above) fit.
        unsafe {
            // A large payload goes first, the way the copy's timings say
            // (as a frame's, `payload_copy`); a small one after the rest,
            // as the first line's share of it goes with the header.
            let large = payload.len() >= payload_copy::STREAM_MIN;
            let streamed = large && self.payload_copy.copy(payload.as_ptr(), s.add(8 + BOX_HEADER_LEN), payload.len(), &self.seg.control(r.port).read_costs);
            let word = (BOX_HEADER_LEN + payload.len()) as u64 | BOXED | if streamed { STREAMED } else { 0 };
            std::ptr::copy_nonoverlapping(word.to_le_bytes().as_ptr(), s, 8);
            std::ptr::copy_nonoverlapping(header.as_ptr(), s.add(8), BOX_HEADER_LEN);
            std::ptr::copy_nonoverlapping(port.as_ptr(), s.add(8 + BOX_PORT_OFFSET), 2);
            if !large {
                std::ptr::copy_nonoverlapping(payload.as_ptr(), s.add(8 + BOX_HEADER_LEN), payload.len());
            }
        }
        self.publish(r, tail, SLOT_PREFIX + BOX_HEADER_LEN + payload.len());
        self.tx_boxed += 1;
        Ok(true)
    }

    /// The start of frame `i` of a batch, `f`, once its length is one the
    /// wire carries (one it does not is counted): up to the MTU, or any
    /// length if its payload is lent (only its headers go into the ring,
    /// and only a unicast frame is lent: see `send_to_targets`).
    #[inline]
    fn checked_start<'f>(&mut self, i: usize, f: &'f TxFrame<'_>, copy: &'f mut [u8; 64]) -> io::Result<&'f [u8]> {
        let len = f.len();
        let unicast = f.header.first().is_some_and(|b| b & 1 == 0);
        let max = if self.lends(f) && unicast { usize::MAX } else { ETH_HEADER_LEN + MTU };
        if !(ETH_HEADER_LEN..=max).contains(&len) {
            self.tx_oversize += 1;
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("frame {i} of the batch is {len} bytes; shm wire {:?} takes {ETH_HEADER_LEN}..={} (more only if it lends the payload)", self.wire, ETH_HEADER_LEN + MTU)));
        }
        Ok(f.start(copy))
    }

    /// Appends `f` to the rings of the ports found for it (`targets`);
    /// false if a unicast frame found a ring full (it is sent again
    /// later). A broadcast one is best effort.
    #[inline]
    fn send_to_targets(&mut self, f: &TxFrame<'_>, broadcast: bool) -> bool {
        let lend = self.lends(f) && !broadcast;
        for k in 0..self.targets.len() {
            if !self.append(self.targets[k], f, lend) && !broadcast {
                self.tx_ring_full += 1;
                return false;
            }
        }
        self.tx_frames += 1;
        self.tx_lent += u64::from(lend && !self.targets.is_empty());
        true
    }

    /// Is `f`'s payload lent (if it goes to one port)? What `path_to`
    /// promises the engine (`Path::lends_from`).
    #[inline(always)]
    fn lends(&self, f: &TxFrame<'_>) -> bool {
        f.lendable && f.payload_len() >= self.lend_min
    }

    /// Appends `frame` to port `r`'s ring, its payload lent if `lend`;
    /// false if the ring is full.
    fn append(&mut self, r: Route, frame: &TxFrame<'_>, lend: bool) -> bool {
        let tail = match self.reserve(r) {
            Reserved::Slot(tail) => tail,
            Reserved::Gone => return true,
            Reserved::Full => return false,
        };
        let s = self.seg.slot(r.port, tail);
        // SAFETY: slot `tail` is ours to write until published
        // (`reserve`); `frame` fits (checked against the MTU by
        // `transmit`), and so do its headers and lent record.
        unsafe {
            let s = s.add(SLOT_PREFIX - 8); // the length word; the frame follows it
            if lend {
                let h = frame.header.len();
                std::ptr::copy_nonoverlapping((h as u64 | LENT).to_le_bytes().as_ptr(), s, 8);
                std::ptr::copy_nonoverlapping(frame.header.as_ptr(), s.add(8), h);
                let mut rec = [0u64; 1 + 2 * MAX_GATHER];
                rec[0] = u64::from(self.pid) | (frame.pieces as u64) << 32;
                for (i, p) in frame.pieces().iter().enumerate() {
                    (rec[1 + 2 * i], rec[2 + 2 * i]) = (p.as_ptr() as u64, p.len() as u64);
                }
                std::ptr::copy_nonoverlapping(rec.as_ptr().cast::<u8>(), s.add(8 + h.next_multiple_of(8)), 8 * (1 + 2 * frame.pieces));
                // The block beside it through which the receiver may
                // share the copy with us (`via_device::shared_copy`).
                (*s.add(shared_copy_at(h)).cast::<SharedCopy>()).reset(self.records.next(frame.payload_len()));
            } else {
                write_frame(frame, s, &mut self.payload_copy, &self.seg.control(r.port).read_costs);
            }
        }
        // (A lent frame counts its payload, which stays in the sender's
        // memory: a large frame, not hinted.)
        self.publish(r, tail, SLOT_PREFIX + frame.len());
        true
    }

    /// Takes port `r`'s lock and the next slot of its ring: `Slot(tail)`
    /// with the lock held, for the caller to write and then [`publish`]
    /// (`Self::publish`); `Gone` when the port changed hands since the
    /// route was found (what was for it goes into the void); `Full` when
    /// the ring has no room (we asked to be woken when it has).
    ///
    /// Slot `tail` is then outside head..tail, so its owner does not read
    /// it (its sequence word says tail + 1 - SLOTS or less), and no other
    /// sender writes it while we hold the lock.
    #[inline(always)]
    fn reserve(&mut self, r: Route) -> Reserved {
        let c = self.seg.control(r.port);
        loop {
            self.seg.lock(r.port, self.pid);
            // The port may have changed hands since we looked.
            if c.state.load(Ordering::Acquire) != LIVE || c.generation.load(Ordering::Acquire) != r.generation {
                self.seg.unlock(r.port);
                return Reserved::Gone;
            }
            // The owner's line is read only when the ring looks full.
            let tail = c.tail.load(Ordering::Relaxed);
            if tail - c.head_seen.load(Ordering::Relaxed) < SLOTS {
                return Reserved::Slot(tail);
            }
            let head = c.head.load(Ordering::Acquire);
            c.head_seen.store(head, Ordering::Relaxed);
            if tail - head < SLOTS {
                return Reserved::Slot(tail);
            }
            // Full: ask to be woken when the owner makes room, then look
            // once more (it may have made room meanwhile).
            c.blocked.fetch_or(1 << self.port, Ordering::SeqCst);
            let room = tail - c.head.load(Ordering::SeqCst) < SLOTS;
            self.seg.unlock(r.port);
            if !room {
                return Reserved::Full;
            }
        }
    }

    /// Publishes slot `tail` of port `r`'s ring, written since
    /// [`Self::reserve`] took it (its first `used` bytes), lets the lock
    /// go, and rings the owner's doorbell if a thread of it sleeps.
    #[inline(always)]
    fn publish(&mut self, r: Route, tail: u64, used: usize) {
        via_device::probe::sending();
        let c = self.seg.control(r.port);
        let s = self.seg.slot(r.port, tail);
        // Published: the owner, polling this slot, takes it.
        self.seg.slot_seq(r.port, tail).store(tail + 1, Ordering::Release);
        // A small frame's lines go where the owner reads them soonest.
        self.hints.published(s, used);
        // SeqCst (on our own line: the owner spins on the slot's, which
        // a locked store would hold back until the payload drained), with
        // the look at `sleepers` below, pairs with `prepare_sleep`: either
        // it sees the tail past its head or we see it counted (module
        // comment).
        c.tail.swap(tail + 1, Ordering::SeqCst);
        self.seg.unlock(r.port);
        // Does a thread of the owner sleep, or is one about to? Then ring,
        // once until it empties the eventfd.
        if c.sleepers.load(Ordering::SeqCst) as u32 != 0 {
            self.ring_doorbell(r);
        }
        // The next frame's lines past the first, owned before it comes.
        self.hints.next_slot(self.seg.slot(r.port, tail + 1), used);
    }

    /// Rings the doorbells of the ports that found our ring full (we just
    /// made room: the head was stored SeqCst, which with this SeqCst look
    /// pairs with a full sender's mark and look at the head in `reserve`).
    fn wake_blocked(&mut self) {
        let c = self.seg.control(self.port);
        if c.blocked.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut mask = c.blocked.swap(0, Ordering::SeqCst);
        while mask != 0 {
            let p = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let oc = self.seg.control(p);
            // Rung whether or not it sleeps (a full ring is rare): it may be
            // about to, with its frames unsent.
            if oc.state.load(Ordering::Acquire) == LIVE {
                self.ring_doorbell(Route { port: p, generation: oc.generation.load(Ordering::Acquire), filter: None });
            }
        }
    }

    /// Rings port `r`'s eventfd, unless it was rung and not emptied since
    /// (`rung`): once is enough to wake it.
    fn ring_doorbell(&mut self, r: Route) {
        if self.seg.control(r.port).rung.swap(1, Ordering::SeqCst) != 0 {
            return;
        }
        let fresh = self.doorbells[r.port].as_ref().is_none_or(|(g, _)| *g != r.generation);
        if fresh {
            let c = self.seg.control(r.port);
            let (pid, fd) = (c.pid.load(Ordering::Acquire), c.wake_fd.load(Ordering::Acquire));
            if !self.members.trusts(&self.seg, pid) {
                // A port of a process that is gone, or one claimed in the
                // name of a process that is not of our user.
                self.doorbell_refused(alive(pid).then_some(format_args!("process {pid} is not a process of our user on the wire")));
                return;
            }
            match sys::copy_fd(pid, fd) {
                Ok(copy) if !members::is_eventfd(copy.as_raw_fd()) => {
                    self.doorbell_refused(Some(format_args!("process {pid}'s descriptor {fd} is not an eventfd")));
                    return;
                }
                Ok(fd) => {
                    self.doorbells[r.port] = Some((r.generation, EventFd::from(fd)));
                }
                Err(e) => {
                    // The owner is going away (ESRCH), or we may not copy
                    // its descriptors (EPERM: Yama's ptrace policy without
                    // PR_SET_PTRACER, another user): then it sleeps
                    // through our frames until a timeout, so say so once.
                    self.doorbell_failed += 1;
                    if e.raw_os_error() != Some(libc::ESRCH) && self.doorbell_failed == 1 {
                        eprintln!("via shm wire {:?}: cannot take process {pid}'s doorbell: {e}; it will not be woken for our frames", self.wire);
                    }
                    return;
                }
            }
        }
        if let Some((_, fd)) = &self.doorbells[r.port] {
            fd.signal();
            self.doorbells_rung += 1;
        }
    }

    /// Counts a doorbell we will not ring, and says why the first time.
    fn doorbell_refused(&mut self, why: Option<std::fmt::Arguments<'_>>) {
        self.doorbell_failed += 1;
        if let Some(why) = why.filter(|_| self.doorbell_failed == 1) {
            eprintln!("via shm wire {:?}: not ringing a doorbell: {why}; its owner will not be woken for our frames", self.wire);
        }
    }

    /// Hands up to `budget` frames to `sink`: lent payloads as such if
    /// `lent_ok`, read into whole frames otherwise.
    #[inline(always)]
    fn take(&mut self, budget: usize, lent_ok: bool, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let c = self.seg.control(self.port);
        let mut head = self.rx_head;
        let mut n = 0;
        for looked_twice in [false, true] {
            // A slot is full when its sequence word says so: the owner
            // reads no shared index, only the slot it takes next.
            while n < budget && self.seg.slot_seq(self.port, head).load(Ordering::Acquire) == head + 1 {
                let s = self.seg.slot(self.port, head).wrapping_add(SLOT_PREFIX - 8);
                // SAFETY: slot `head` was published by its sender (the
                // sequence word was stored after the copy) and is not
                // written again until we publish a head past it, below.
                let word = u64::from_le_bytes(unsafe { std::slice::from_raw_parts(s, 8) }.try_into().unwrap());
                via_device::probe::seen();
                prefetch_frame(s, word);
                // SAFETY: as above.
                let delivered = match unsafe { read_slot(s, word) } {
                    Some((frame, None)) if word & BOXED != 0 => match placed_word_of(&self.seg, frame) {
                        Some(placed) => {
                            self.rx_boxed += 1;
                            self.read_timer.hand_over(word & STREAMED != 0, frame.len(), &c.read_costs, || sink(frame, RxMeta { lent: None, vouched: true, boxed: Some(placed), ..RxMeta::default() }));
                            true
                        }
                        None => {
                            self.rx_bad_length += 1;
                            false
                        }
                    },
                    Some((frame, None)) => {
                        self.read_timer.hand_over(word & STREAMED != 0, frame.len(), &c.read_costs, || sink(frame, RxMeta { lent: None, vouched: true, ..RxMeta::default() }));
                        true
                    }
                    Some((_, Some(lent))) if !self.members.trusts(&self.seg, lent.pid) => {
                        // Not a member of our uid: never read.
                        self.rx_lent_refused += 1;
                        false
                    }
                    Some((frame, Some(mut lent))) if lent_ok => {
                        // SAFETY: the slot is ours until we publish a head
                        // past it (read_slot found its block).
                        let block = unsafe { shared_block(s, word) };
                        lent.shared = block.and_then(|b| shared_copies::shared_ref(&self.seg, b, self.port, head, lent.pid));
                        sink(frame, RxMeta { lent: Some(&lent), vouched: true, ..RxMeta::default() });
                        true
                    }
                    Some((frame, Some(lent))) if frame.len() + lent.len() > ETH_HEADER_LEN + MTU => {
                        // A whole message lent as one frame: longer than
                        // a caller that takes no lent payloads takes.
                        self.rx_bad_length += 1;
                        false
                    }
                    Some((frame, Some(lent))) => {
                        // Read the payload in: a whole frame for a caller
                        // that takes no lent payloads.
                        self.scratch.clear();
                        self.scratch.extend_from_slice(frame);
                        self.scratch.resize(frame.len() + lent.len(), 0);
                        // SAFETY: the scratch holds the payload's bytes past the headers.
                        let ok = unsafe { lent.read(0, self.scratch.as_mut_ptr().add(frame.len()), lent.len()) }.is_ok();
                        if ok {
                            sink(&self.scratch, RxMeta { lent: None, vouched: true, ..RxMeta::default() });
                        } else {
                            self.rx_lent_failed += 1;
                        }
                        ok
                    }
                    None => {
                        self.rx_bad_length += 1;
                        false
                    }
                };
                via_device::probe::mark(via_device::probe::Stage::Delivered);
                n += usize::from(delivered);
                head += 1;
            }
            if n > 0 || looked_twice {
                break;
            }
            if budget == 0 {
                return Ok(0);
            }
            // Found nothing: if the doorbell was rung, empty it, then say
            // so and look once more (a sender that saw it still rung did
            // not ring; the SeqCst store and look at the tail pair with the
            // senders' swap of the tail and of `rung`).
            if c.rung.load(Ordering::Acquire) == 0 {
                break;
            }
            self.wake.drain();
            c.rung.store(0, Ordering::SeqCst);
            if c.tail.load(Ordering::SeqCst) == head {
                break; // nothing appended since: the look would find nothing
            }
        }
        if head != self.rx_head {
            // The slots taken are free again (one store per batch).
            self.rx_head = head;
            c.head.store(head, Ordering::SeqCst);
            self.wake_blocked();
        }
        self.rx_frames += n as u64;
        Ok(n)
    }
}

/// The word a boxed message's receiver says its placements in: its
/// sender's port and VI, as its header names them.
fn placed_word_of(seg: &Segment, record: &[u8]) -> Option<PlacedWord> {
    let at = |i: usize| record.get(i..i + 2).map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
    let (port, vi) = (at(BOX_PORT_OFFSET)?, at(BOX_SRC_VI_OFFSET)?);
    if record.len() < BOX_HEADER_LEN || port >= PORTS || vi >= BOX_VIS {
        return None;
    }
    // SAFETY: the word lies in the segment, which the device holds (an
    // `Arc`) for as long as it lives.
    Some(unsafe { PlacedWord::new(seg.placed(port, vi)) })
}

/// Where a lent record's shared block lies, from the slot's length word
/// (`s` in `append` and `read_slot`), for headers of `h` bytes: past the
/// record, on the next 64-byte boundary of the slot (which is 8 bytes
/// before `s`).
fn shared_copy_at(h: usize) -> usize {
    (8 + 8 + h.next_multiple_of(8) + 8 * (1 + 2 * MAX_GATHER)).next_multiple_of(64) - 8
}

/// A slot's bytes from its length word on.
const SLOT_ROOM: usize = SLOT_BYTES - (SLOT_PREFIX - 8);

/// The shared block of the lent record in the slot whose length word,
/// `word`, lies at `s`: None unless the word says lent and the block fits
/// in the slot.
///
/// # Safety
/// `s` must point at a slot's length word, in the segment's mapping.
unsafe fn shared_block<'a>(s: *const u8, word: u64) -> Option<&'a SharedCopy> {
    let at = shared_copy_at((word & !LENGTH_FLAGS) as usize);
    if word & LENT == 0 || at + std::mem::size_of::<SharedCopy>() > SLOT_ROOM {
        return None;
    }
    // SAFETY: inside the slot (checked above), at a 64-byte boundary of
    // the 64-byte aligned slot (`shared_copy_at`).
    Some(unsafe { &*s.add(at).cast::<SharedCopy>() })
}

/// The frame in a slot whose length word is `word`, and its lent payload
/// if it has one; None if the slot's contents are inconsistent.
///
/// # Safety
/// `s` must point at the length word of a published slot (the slot's
/// [`SLOT_BYTES`] less its sequence word to its end) that nobody writes
/// while the result is in use.
unsafe fn read_slot<'a>(s: *const u8, word: u64) -> Option<(&'a [u8], Option<LentPayload>)> {
    let len = (word & !LENGTH_FLAGS) as usize;
    if !(ETH_HEADER_LEN..=SLOT_ROOM - 8).contains(&len) {
        return None;
    }
    // SAFETY: `len` was checked against the slot.
    let frame = unsafe { std::slice::from_raw_parts(s.add(8), len) };
    if word & LENT == 0 {
        return Some((frame, None));
    }
    let at = 8 + len.next_multiple_of(8);
    if at + 8 * (1 + 2 * MAX_GATHER) > SLOT_ROOM {
        return None;
    }
    let word_at = |i: usize| {
        let mut b = [0u8; 8];
        // SAFETY: `at + 8 * i` lies inside the slot (checked above).
        unsafe { std::ptr::copy_nonoverlapping(s.add(at + 8 * i), b.as_mut_ptr(), 8) };
        u64::from_le_bytes(b)
    };
    // SAFETY: as the caller promised.
    unsafe { shared_block(s, word) }?;
    let w0 = word_at(0);
    let mut lent = LentPayload { pid: w0 as u32, n: (w0 >> 32) as usize, ..LentPayload::default() };
    if lent.n > MAX_GATHER {
        return None;
    }
    for i in 0..lent.n {
        let (addr, plen) = (word_at(1 + 2 * i), word_at(2 + 2 * i));
        lent.pieces[i] = (addr, u32::try_from(plen).ok()?);
    }
    Some((frame, Some(lent)))
}

impl FrameDevice for ShmDevice {
    fn mac(&self) -> MacAddr {
        self.identity
    }

    fn mtu(&self) -> usize {
        MTU
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: true, needs_pinning: false, reorders: false, serves_peers: true }
    }

    fn wait_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        let c = self.seg.control(self.port);
        c.filter[1].store(u64::from(filter.accept[0]) | u64::from(filter.accept[1]) << 32, Ordering::Release);
        c.filter[0].store(u64::from(filter.ethertype) << 32 | filter.offset as u64, Ordering::Release);
        self.seg.header().epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // Boxed messages are not frames: only an engine, which receives
        // with `receive_lent`, is sent them (it asked for a box route).
        self.take(budget, false, &mut |f, meta| {
            if meta.boxed.is_none() {
                sink(f)
            }
        })
    }

    fn box_route(&mut self, head: &[u8], vi: u16) -> Option<BoxRoute> {
        ShmDevice::box_route(self, head, vi)
    }

    fn transmit_boxed(&mut self, route: &BoxRoute, header: &[u8; BOX_HEADER_LEN], payload: &[u8]) -> io::Result<bool> {
        ShmDevice::transmit_boxed(self, route, header, payload)
    }

    /// Every process on the wire takes frames up to its MTU (one slot
    /// size), whatever its composite's NICs take.
    fn path_to(&mut self, _head: &[u8]) -> Path {
        let lends_from = (self.lend_min != usize::MAX).then_some(self.lend_min);
        Path { mtu: self.mtu(), checksummed: self.capabilities().checksummed, both_ends: true, lends_from }
    }

    fn prepare_sleep(&mut self) -> Option<Sleep> {
        let c = self.seg.control(self.port);
        // SeqCst count, then SeqCst look at the tail: pairs with a
        // sender's swap of the tail and look at `sleepers` (module comment).
        let counted = c.sleepers.fetch_add(1, Ordering::SeqCst) + 1;
        let (seg, port, generation) = (std::sync::Arc::clone(&self.seg), self.port, counted >> 32);
        // Counts down this port's owner's sleepers, unless the port has had
        // another owner since (its count is not ours).
        let end = move || {
            let w = &seg.control(port).sleepers;
            let _ = w.fetch_update(Ordering::SeqCst, Ordering::Relaxed, |v| (v >> 32 == generation && v as u32 != 0).then(|| v - 1));
        };
        if c.tail.load(Ordering::SeqCst) != self.rx_head {
            end(); // frames came: do not sleep
            return None;
        }
        Some(Sleep::ended_by(end))
    }

    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        self.take(budget, true, sink)
    }

    /// The sequence word of the slot taken next: its sender's last store.
    fn rx_watch(&self, w: &mut RxWatches) {
        let seq = self.seg.slot_seq(self.port, self.rx_head);
        let now = seq.load(Ordering::Acquire);
        if now == self.rx_head + 1 {
            w.ready();
        }
        // SAFETY: the slot lies in the segment's mapping, which the
        // device holds (an `Arc`) until it is dropped.
        w.push(unsafe { RxWatch::u64(seq, now) });
        // A receiver of ours posting a copy for us to share.
        if self.records.shared {
            let posted = &self.seg.control(self.port).copy_posted;
            // SAFETY: as above (the word lies in our port's control block).
            w.push(unsafe { RxWatch::u64(posted, posted.load(Ordering::Acquire)) });
        }
    }

    fn serve_peers(&mut self) -> usize {
        if !self.records.shared {
            return 0; // the common case: nothing lent that is worth sharing
        }
        let Some((block, record, lent)) = shared_copies::posted_to(&self.seg, self.port, self.pid, &self.records) else { return 0 };
        let wrote = block.help(record, &lent);
        self.chunks_written += wrote as u64;
        wrote
    }

    /// The slot taken next holds a frame, or a receiver posted a copy
    /// for us to share.
    fn rx_pending(&self) -> Option<bool> {
        Some(self.seg.slot_seq(self.port, self.rx_head).load(Ordering::Acquire) == self.rx_head + 1 || (self.records.shared && shared_copies::posted_to(&self.seg, self.port, self.pid, &self.records).is_some()))
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let mut copy = [0u8; 64];
        for (i, f) in frames.iter().enumerate() {
            let head = match self.checked_start(i, f, &mut copy) {
                Ok(h) => h,
                Err(e) => return if i == 0 { Err(e) } else { Ok(i) },
            };
            self.find_targets(head);
            if self.targets.is_empty() {
                self.tx_no_port += 1;
            }
            let broadcast = MacAddr(head[..6].try_into().unwrap()).is_broadcast();
            if !self.send_to_targets(f, broadcast) {
                return Ok(i);
            }
        }
        Ok(frames.len())
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("shm_rx_frames", self.rx_frames),
            ("shm_tx_frames", self.tx_frames),
            ("shm_tx_lent", self.tx_lent),
            ("shm_lent_chunks_written", self.chunks_written),
            ("shm_tx_streamed", self.payload_copy.streamed),
            ("shm_tx_boxed", self.tx_boxed),
            ("shm_rx_boxed", self.rx_boxed),
            ("shm_tx_ring_full", self.tx_ring_full),
            ("shm_tx_no_port", self.tx_no_port),
            ("shm_tx_oversize", self.tx_oversize),
            ("shm_rx_bad_length", self.rx_bad_length),
            ("shm_rx_lent_failed", self.rx_lent_failed),
            ("shm_rx_lent_refused", self.rx_lent_refused),
            ("shm_doorbell_failed", self.doorbell_failed),
            ("shm_doorbells_rung", self.doorbells_rung),
        ]
    }
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        let c = self.seg.control(self.port);
        self.seg.lock(self.port, self.pid);
        c.state.store(FREE, Ordering::Release);
        c.pid.store(0, Ordering::Release);
        self.seg.unlock(self.port);
        self.seg.header().epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// The descriptor calls, each confining its `unsafe`.
mod sys {
    use super::*;

    /// Lets processes of our user copy our descriptors (`pidfd_getfd`)
    /// under Yama's "restricted ptrace" policy; without Yama it fails, and
    /// nothing is needed.
    pub fn allow_fd_copies() {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    }

    /// May processes of our user read and write each other's memory
    /// (`process_vm_readv`, `process_vm_writev`), as a lent payload's ends
    /// do? Not under
    /// Yama's "admin-only" or "no attach" policies (scope 2 and 3; under
    /// scope 1 every process on a wire allows it, `allow_fd_copies`), nor
    /// where a seccomp filter refuses the calls (they are tried once, on
    /// our own memory). Asked once per process.
    pub fn lending_possible() -> bool {
        static POSSIBLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *POSSIBLE.get_or_init(|| {
            let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0);
            let (src, mut dst) = (0x5eed_u64, 0_u64);
            let local = libc::iovec { iov_base: (&raw mut dst).cast(), iov_len: 8 };
            let remote = libc::iovec { iov_base: (&raw const src).cast_mut().cast(), iov_len: 8 };
            // SAFETY: both ranges are our own locals, alive for the call.
            let read = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
            // (And the sender's share of a copy, `process_vm_writev`.)
            let back = libc::iovec { iov_base: (&raw const dst).cast_mut().cast(), iov_len: 8 };
            // SAFETY: as above.
            let written = unsafe { libc::process_vm_writev(libc::getpid(), &back, 1, &local, 1, 0) };
            scope < 2 && read == 8 && written == 8 && dst == src
        })
    }

    /// Our own copy of descriptor `fd` of process `pid`.
    pub fn copy_fd(pid: u32, fd: u32) -> io::Result<OwnedFd> {
        let pidfd = members::pidfd_open(pid)?;
        // SAFETY: pidfd_getfd takes a live pidfd, a descriptor number and flags.
        let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as libc::c_int, 0) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel gave us this descriptor (close-on-exec).
        Ok(unsafe { OwnedFd::from_raw_fd(copy as RawFd) })
    }
}

/// Asks for the cache lines of a small frame in the slot whose length
/// word is at `s` (`word` its value) past the first, which its sender has
/// just written: all at once, before the engine's checks read the headers
/// and then the payload one line after another (via-shm 64 B 0.72 ->
/// 0.65 us). Only the first [`PREFETCH_LINES`]: asking for every line of
/// a 64 KiB frame cost a tenth of the 1 MiB bandwidth, where the
/// processor's own prefetcher follows a long copy anyway.
#[inline]
fn prefetch_frame(s: *const u8, word: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const PREFETCH_LINES: usize = 4;
        let end = (8 + (word & !LENGTH_FLAGS) as usize).min(SLOT_BYTES - (SLOT_PREFIX - 8)).min(64 * (1 + PREFETCH_LINES));
        let mut at = 64 - (SLOT_PREFIX - 8); // the slot's second line
        while at < end {
            // SAFETY: a prefetch is a hint: it reads nothing into the
            // program and cannot fault; the address lies inside the slot.
            unsafe { _mm_prefetch(s.wrapping_add(at).cast::<i8>(), _MM_HINT_T0) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, word);
}

/// Writes `frame` (its payload not lent) after the length word at `s`,
/// and the length word. The slot's first cache line, which the owner
/// polls (its sequence word), is written last and at once: the bytes
/// past it first, then the length word and the frame's first bytes, then
/// (by the caller) the sequence word. Written in order, that line went to
/// this core for the length word, back to the polling owner, and here
/// again for the rest.
///
/// # Safety
/// `s` is a slot's length word with room for the frame after it, and
/// nobody else reads or writes the slot meanwhile.
#[inline]
unsafe fn write_frame(frame: &TxFrame<'_>, s: *mut u8, copy: &mut PayloadCopy, read: &payload_copy::ReadCosts) {
    const IN_FIRST_LINE: usize = 64 - SLOT_PREFIX;
    let dst = s.wrapping_add(8);
    let h = frame.header;
    // SAFETY (all three copies): the caller gives room for the frame's
    // `frame.len()` bytes at `dst`, and the frame's parts are its own.
    unsafe {
        if h.len() >= IN_FIRST_LINE {
            // Every frame the engine builds: its header fills the first
            // line's share; the pieces follow the header in turn.
            std::ptr::copy_nonoverlapping(h.as_ptr().add(IN_FIRST_LINE), dst.add(IN_FIRST_LINE), h.len() - IN_FIRST_LINE);
            let mut at = h.len();
            let mut streamed = false;
            for p in frame.pieces() {
                streamed |= copy.copy(p.as_ptr(), dst.add(at), p.len(), read);
                at += p.len();
            }
            let word = at as u64 | if streamed { STREAMED } else { 0 };
            std::ptr::copy_nonoverlapping(word.to_le_bytes().as_ptr(), s, 8);
            std::ptr::copy_nonoverlapping(h.as_ptr(), dst, IN_FIRST_LINE);
        } else {
            copy_frame_range(frame, IN_FIRST_LINE, usize::MAX, dst);
            std::ptr::copy_nonoverlapping((frame.len() as u64).to_le_bytes().as_ptr(), s, 8);
            copy_frame_range(frame, 0, IN_FIRST_LINE, dst);
        }
    }
}

/// Copies bytes `[from, to)` of `frame` (its header, then its pieces, as
/// on the wire; `to` past the end: to the end) to `dst + from`.
///
/// # Safety
/// `dst` must be valid for writes of `frame.len()` bytes and not overlap
/// the frame's pieces.
unsafe fn copy_frame_range(frame: &TxFrame<'_>, from: usize, to: usize, dst: *mut u8) {
    let mut at = 0;
    for part in std::iter::once(frame.header).chain(frame.pieces().iter().copied()) {
        let (lo, hi) = (at.max(from), (at + part.len()).min(to));
        if lo < hi {
            // SAFETY: `[lo, hi)` lies inside the frame, so inside `dst`'s
            // `frame.len()` bytes, and inside this part.
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr().add(lo - at), dst.add(lo), hi - lo) };
        }
        at += part.len();
    }
}

#[cfg(test)]
mod tests;
