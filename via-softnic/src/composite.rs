//! [`CompositeDevice`]: one VIA device made of several NICs and,
//! optionally, a shared-memory wire, as SCore's composite devices were: a
//! frame for a process attached to the wire on this host goes through
//! shared memory, a frame for a host the routing table names goes through
//! the NIC that reaches it, addressed to the host's MAC on that NIC's
//! network, and every other frame through the first NIC. The engine above
//! sees one device whose MAC (the *identity*) is the first NIC's.
//!
//! The routing table has two sources:
//! - discovery: the wire's port table. A process attaches with its
//!   identity and its receive filter, so a frame whose destination and
//!   endpoint some attached process takes goes there ([`ShmDevice::takes`]);
//! - the hosts file (`VIA_HOSTS`): a line `name MAC DEVICE=MAC` says that
//!   the host whose identity is the first MAC is reached through member
//!   `DEVICE` at the second MAC. Whoever opens the device reads the file
//!   (via-user, through the kernel agent's name service) and hands its
//!   [`HostRoute`]s down.
//!
//! A frame sent by a route goes out with its addresses rewritten to that
//! network's (destination: the host's address there; source: our NIC's
//! MAC there); a frame received on a member has them rewritten back
//! (source: the identity the table gives its address; destination: ours),
//! so the engine only ever sees identities. Frames from a host the table
//! does not know keep the source they came with.
//!
//! Broadcasts take every member: a NIC does not hand a process what other
//! processes send on it, so the wire is how they reach this host's
//! processes, and each NIC reaches its own network. Receiving takes turns
//! between the members, so none starves the others, and the wait
//! descriptor is an epoll set of them all.
//!
//! A host the hosts file names with several `DEVICE=MAC` routes is
//! *striped*: its frames of [`STRIPE_MIN`] bytes or more (the fragments of
//! a large message) take its members in turn, and shorter ones (ACKs,
//! small messages) its first. Its path's MTU is the smallest of its
//! members'. The frames of a message then reach it by several ways, not in
//! order: the composite then receives from its members in rounds of
//! [`RX_QUANTUM`] frames each, which keeps them close to their order, and
//! says it reorders ([`Capabilities::reorders`]), so the engine's selective
//! repeat waits a moment before it calls a gap a loss, and puts them back
//! in order (as MP_Lite's channel bonding did above TCP).
//!
//! The MTU is the smallest NIC's, except to a process on the wire or a
//! routed host ([`FrameDevice::path_to`]): the engine sends those frames as
//! long as their member carries (64 KiB on the wire, whose payloads it
//! lends rather than copies if it was opened with `,lend=<bytes>`). Should
//! such a frame find its process gone and be routed to a NIC that cannot
//! carry it, it is dropped and counted (the engine's retransmission timer
//! then gives up on the connection): it cannot be cut to size here. The
//! wire cannot corrupt a frame either: its path is checksummed and every
//! frame it hands up vouched for ([`via_device::RxMeta`]), so the engine
//! neither seals nor checks a CRC on it.

use crate::shm::ShmDevice;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use via_device::ETH_HEADER_LEN;
use via_device::{BoxRoute, Capabilities, FrameDevice, HostRoute, MacAddr, Path, RxFilter, RxMeta, RxWatch, RxWatches, Sleep, TxFrame, BOX_HEADER_LEN};

/// NICs a composite may own.
pub const MAX_NICS: usize = 4;
/// Longest frame header rewritten in place of the engine's (the rest of
/// the frame is gathered from where it is).
const HEADER_MAX: usize = 128;
/// Frames whose headers are rewritten (and routes sorted) at a time.
const REWRITE_CHUNK: usize = 32;
/// Frames to a striped host at least this long take its members in turn;
/// shorter ones take its first.
pub const STRIPE_MIN: usize = 512;
/// Frames taken from each member per round of a receive.
pub const RX_QUANTUM: usize = 8;
/// Frames sent through each NIC, by index (stats names must be static).
const TX_NAMES: [&str; MAX_NICS] = ["composite_tx_nic0", "composite_tx_nic1", "composite_tx_nic2", "composite_tx_nic3"];

/// One NIC of the composite.
struct Nic {
    dev: Box<dyn FrameDevice>,
    mac: MacAddr,
    tx: u64,
}

/// The ways to one host the hosts file gives: (NIC, the host's address
/// on that NIC's network), in the file's order; more than one: striped.
#[derive(Debug, Default)]
struct HostRoutes {
    ways: Vec<(usize, MacAddr)>,
    /// The way the next long frame takes.
    next: usize,
}

impl HostRoutes {
    /// The way a frame of `len` bytes takes.
    fn pick(&mut self, len: usize) -> (usize, MacAddr) {
        if self.ways.len() == 1 || len < STRIPE_MIN {
            return self.ways[0];
        }
        let w = self.ways[self.next];
        self.next = if self.next + 1 == self.ways.len() { 0 } else { self.next + 1 };
        w
    }
}

/// NICs and a shared-memory wire under one identity.
pub struct CompositeDevice {
    nics: Vec<Nic>,
    shm: Option<ShmDevice>,
    /// Host identity → the ways to it.
    routes: HashMap<MacAddr, HostRoutes>,
    /// (NIC, address there) → host identity.
    identities: HashMap<(usize, MacAddr), MacAddr>,
    epoll: OwnedFd,
    /// Which member receives first next time.
    turn: usize,
    /// The watched word of each member (NICs, then the wire) that last
    /// found nothing, as it left it: until it moves that member has no
    /// frame and is not asked again (one load instead of calls into it). A
    /// member that gave frames, or has no single word, is asked every round.
    /// (The wire asked at every round instead, its own look being one load
    /// too, counted ~40 instructions fewer a message in `engine_cost` and
    /// measured ~3 % slower in the two-process ping-pong, six alternating
    /// pairs: 0.275 against 0.267 us. Why is not known; the watch's making
    /// loads the next slot's word right after the empty receive.)
    watches: [Option<RxWatch>; MAX_NICS + 1],
    /// Some host is reached by several members: receive in rounds.
    striped: bool,
    /// The route of each frame of the batch being sent.
    plan: Vec<Route>,
    /// A received frame with its addresses rewritten back.
    scratch: Vec<u8>,
    /// Frames for a NIC longer than its MTU, dropped.
    nic_oversize: u64,
    /// Routed frames whose header was too short or too long to rewrite,
    /// sent through the first NIC as they were.
    unroutable: u64,
}

impl std::fmt::Debug for CompositeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompositeDevice").field("identity", &self.mac()).field("nics", &self.nics.len()).field("shm", &self.shm).field("routes", &self.routes).finish_non_exhaustive()
    }
}

/// Which member(s) a frame takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// NIC `k`, addressed to the identity (no rewriting).
    Nic(usize),
    /// NIC `k`, rewritten to the destination's address there.
    Routed(usize, MacAddr),
    Shm,
    /// A broadcast: every member.
    All,
    /// Longer than its NIC's MTU (sized for a process on the wire that has
    /// gone): dropped and counted.
    Drop,
}

impl CompositeDevice {
    /// Joins `nics` (named as in the composite's name, for the routes) and
    /// the shared-memory wire `wire` (`<wire>[,lend=...]`) under the first
    /// NIC's MAC, with the routes `routes` (from the hosts file).
    pub fn new(nics: Vec<(String, Box<dyn FrameDevice>)>, wire: Option<&str>, routes_given: &[HostRoute]) -> io::Result<CompositeDevice> {
        if nics.is_empty() || nics.len() > MAX_NICS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a composite device takes 1 to {MAX_NICS} NICs, not {}", nics.len())));
        }
        let identity = nics[0].1.mac();
        let shm = wire.map(|w| ShmDevice::open(w, Some(identity))).transpose()?;
        let (mut routes, mut identities) = (HashMap::new(), HashMap::new());
        for (k, (name, _)) in nics.iter().enumerate() {
            for r in routes_given.iter().filter(|r| r.device == *name) {
                routes.entry(r.identity).or_insert_with(HostRoutes::default).ways.push((k, r.there));
                identities.insert((k, r.there), r.identity);
            }
        }
        // The file's order, whatever the order of the members.
        for (id, host) in routes.iter_mut() {
            let order = |&(k, there): &(usize, MacAddr)| routes_given.iter().position(|r| r.identity == *id && r.there == there && r.device == nics[k].0);
            host.ways.sort_by_key(order);
        }
        let fds: Vec<RawFd> = nics.iter().map(|(_, d)| d.wait_fd()).chain(shm.as_ref().map(|s| s.wait_fd())).collect();
        let epoll = sys::epoll(&fds)?;
        let nics = nics.into_iter().map(|(_, dev)| Nic { mac: dev.mac(), dev, tx: 0 }).collect();
        let striped = routes.values().any(|h: &HostRoutes| h.ways.len() > 1);
        Ok(CompositeDevice { nics, shm, routes, identities, epoll, turn: 0, watches: [None; MAX_NICS + 1], striped, plan: Vec::new(), scratch: Vec::new(), nic_oversize: 0, unroutable: 0 })
    }

    /// Opens `name`: members joined by `+`, NICs opened by `open_nic`, at
    /// most one `shm:<wire>`; hosts reached through a NIC other than the
    /// first as `routes` say.
    pub fn open(name: &str, routes: &[HostRoute], open_nic: impl Fn(&str) -> io::Result<Box<dyn FrameDevice>>) -> io::Result<CompositeDevice> {
        let mut nics = Vec::new();
        let mut wire = None;
        for part in name.split('+') {
            match part.strip_prefix("shm:") {
                Some(w) if wire.is_none() => wire = Some(w),
                Some(_) => return Err(io::Error::new(io::ErrorKind::InvalidInput, "more than one shm: member")),
                None => nics.push((part.to_string(), open_nic(part)?)),
            }
        }
        CompositeDevice::new(nics, wire, routes)
    }

    fn route(&mut self, f: &TxFrame<'_>) -> Route {
        // Destination, ethertype and endpoint lie in the first bytes.
        let mut copy = [0u8; 64];
        let head = f.start(&mut copy);
        if head.len() < 6 {
            return Route::Nic(0);
        }
        let dst = MacAddr(head[..6].try_into().unwrap());
        if dst.is_broadcast() {
            return Route::All;
        }
        if self.shm.as_mut().is_some_and(|s| s.takes(head)) {
            return Route::Shm;
        }
        let len = f.len();
        let (k, r) = match self.routes.get_mut(&dst) {
            Some(host) if (ETH_HEADER_LEN..=HEADER_MAX).contains(&f.header.len()) => {
                let (k, there) = host.pick(len);
                (k, Route::Routed(k, there))
            }
            Some(_) => {
                self.unroutable += 1;
                (0, Route::Nic(0))
            }
            None => (0, Route::Nic(0)),
        };
        if len > ETH_HEADER_LEN + self.nics[k].dev.mtu() {
            return Route::Drop;
        }
        r
    }

    /// NICs, and the wire if there is one.
    fn members(&self) -> usize {
        self.nics.len() + usize::from(self.shm.is_some())
    }

    /// Member `i` (NICs, then the wire).
    fn member(&self, i: usize) -> &dyn FrameDevice {
        match self.nics.get(i) {
            Some(n) => &*n.dev,
            None => self.shm.as_ref().expect("a member past the NICs is the wire"),
        }
    }

    /// Does member `i` surely have no frame? True while the word it
    /// reported when it last found nothing has not moved.
    #[inline]
    fn quiet(&self, i: usize) -> bool {
        self.watches[i].is_some_and(|w| !w.changed())
    }

    /// After a receive from member `i` that gave `got`: watched if it
    /// found nothing, else asked again next time.
    #[inline]
    fn received(&mut self, i: usize, got: &io::Result<usize>) {
        self.watches[i] = match got {
            Ok(0) => {
                let mut w = RxWatches::default();
                self.member(i).rx_watch(&mut w);
                w.single()
            }
            _ => None,
        };
    }

    /// The member `i` of the receive order (NICs, then the wire), unless
    /// its words say it has nothing.
    #[inline(always)]
    fn receive_from(&mut self, i: usize, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        if self.quiet(i) {
            return Ok(0);
        }
        let got = self.receive_member(i, budget, sink);
        self.received(i, &got);
        got
    }

    /// [`CompositeDevice::receive_from`] without the look at the words.
    fn receive_member(&mut self, i: usize, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let CompositeDevice { nics, shm, identities, scratch, .. } = self;
        let identity = nics[0].mac;
        let Some(nic) = nics.get_mut(i) else {
            return shm.as_mut().map_or(Ok(0), |s| s.receive_lent(budget, sink));
        };
        let mac = nic.mac;
        nic.dev.receive_lent(budget, &mut |f, meta| {
            if meta.lent.is_some() || f.len() < 12 {
                return sink(f, meta);
            }
            let src = MacAddr(f[6..12].try_into().unwrap());
            let from = identities.get(&(i, src));
            let to_us = mac != identity && f[..6] == mac.0;
            if from.is_none() && !to_us {
                return sink(f, meta);
            }
            scratch.clear();
            scratch.extend_from_slice(f);
            if let Some(id) = from {
                scratch[6..12].copy_from_slice(&id.0);
            }
            if to_us {
                scratch[..6].copy_from_slice(&identity.0);
            }
            sink(scratch, meta)
        })
    }

    /// Receives in rounds of at most [`RX_QUANTUM`] frames from each
    /// member, until the budget is spent or no member had a round's worth:
    /// a striped host's frames, arriving by several members at once, reach
    /// the engine close to the order they were sent in.
    fn receive_rounds(&mut self, members: usize, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let mut more = false;
            let mut i = self.turn;
            for _ in 0..members {
                let quantum = RX_QUANTUM.min(budget - n);
                if quantum == 0 {
                    return Ok(n);
                }
                let got = self.receive_from(i, quantum, sink)?;
                n += got;
                more |= got == quantum;
                i = if i + 1 == members { 0 } else { i + 1 };
            }
            if !more {
                return Ok(n);
            }
        }
    }

    /// Sends `run`, frames that all take `route`; returns how many went.
    fn send_run(&mut self, route: Route, run: &[TxFrame<'_>]) -> io::Result<usize> {
        let sent = match route {
            Route::Nic(k) => self.nics[k].dev.transmit(run)?,
            Route::Routed(k, there) => self.send_as(k, there, run)?,
            Route::Shm => self.shm.as_mut().expect("routed to the wire").transmit(run)?,
            Route::Drop => {
                self.nic_oversize += run.len() as u64;
                run.len()
            }
            Route::All => {
                let sent = self.nics[0].dev.transmit(run)?;
                // Best effort elsewhere, as broadcasts are.
                let rewritable = run[..sent].iter().all(|f| (ETH_HEADER_LEN..=HEADER_MAX).contains(&f.header.len()));
                for k in 1..self.nics.len() {
                    if rewritable {
                        self.send_as(k, MacAddr::BROADCAST, &run[..sent])?;
                    } else {
                        self.nics[k].dev.transmit(&run[..sent])?;
                    }
                }
                if let Some(s) = self.shm.as_mut() {
                    s.transmit(&run[..sent])?;
                }
                sent
            }
        };
        if let Route::Nic(k) | Route::Routed(k, _) = route {
            self.nics[k].tx += sent as u64;
        }
        Ok(sent)
    }

    /// Sends `run` through NIC `k`, each frame addressed to `there` from
    /// our MAC on that network (headers of ETH_HEADER_LEN..=HEADER_MAX
    /// bytes only: [`CompositeDevice::route`] sees to it).
    fn send_as(&mut self, k: usize, there: MacAddr, run: &[TxFrame<'_>]) -> io::Result<usize> {
        let nic = &mut self.nics[k];
        let mut sent = 0;
        // In chunks, on the stack: nothing allocated per batch.
        for chunk in run.chunks(REWRITE_CHUNK) {
            let mut headers = [[0u8; HEADER_MAX]; REWRITE_CHUNK];
            for (h, f) in headers.iter_mut().zip(chunk) {
                h[..f.header.len()].copy_from_slice(f.header);
                h[..6].copy_from_slice(&there.0);
                h[6..12].copy_from_slice(&nic.mac.0);
            }
            let mut out = [TxFrame::new(&[]); REWRITE_CHUNK];
            for ((o, f), h) in out.iter_mut().zip(chunk).zip(&headers) {
                *o = TxFrame { header: &h[..f.header.len()], ..*f };
            }
            let k = nic.dev.transmit(&out[..chunk.len()])?;
            sent += k;
            if k < chunk.len() {
                break;
            }
        }
        Ok(sent)
    }
}

impl FrameDevice for CompositeDevice {
    fn mac(&self) -> MacAddr {
        self.nics[0].mac
    }

    fn mtu(&self) -> usize {
        self.nics.iter().map(|n| n.dev.mtu()).min().unwrap_or(0)
    }

    fn capabilities(&self) -> Capabilities {
        let c = self.nics.iter().map(|n| n.dev.capabilities());
        Capabilities {
            checksummed: c.clone().all(|c| c.checksummed),
            needs_pinning: c.clone().any(|c| c.needs_pinning),
            reorders: c.clone().any(|c| c.reorders) || self.striped,
            serves_peers: self.shm.as_ref().is_some_and(|s| s.capabilities().serves_peers),
        }
    }

    fn wait_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        let set = self.nics.iter_mut().try_for_each(|n| n.dev.set_filter(filter)).and_then(|()| self.shm.as_mut().map_or(Ok(()), |s| s.set_filter(filter)));
        // A member may have dropped or kept frames while its filter changed.
        self.watches = [None; MAX_NICS + 1];
        set
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // Only the wire lends, and its plain receive reads lent payloads in.
        let members = self.members();
        self.turn = (self.turn + 1) % members;
        let mut n = 0;
        for j in 0..members {
            let i = (self.turn + j) % members;
            n += if i == self.nics.len() {
                if self.quiet(i) {
                    continue;
                }
                let got = self.shm.as_mut().map_or(Ok(0), |s| s.receive(budget - n, sink));
                self.received(i, &got);
                got?
            } else {
                self.receive_from(i, budget - n, &mut |f, _| sink(f))?
            };
        }
        Ok(n)
    }

    /// One pass over the members, each giving what it has; when a host is
    /// striped, rounds instead ([`CompositeDevice::receive_rounds`]).
    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let members = self.members();
        // Every NIC's kept word unmoved: only the wire can have frames
        // (between processes of one host, the common case), asked alone.
        if !self.striped && self.shm.is_some() && (0..self.nics.len()).all(|k| self.quiet(k)) {
            return self.receive_from(members - 1, budget, sink);
        }
        self.turn = if self.turn + 1 >= members { 0 } else { self.turn + 1 };
        if self.striped {
            return self.receive_rounds(members, budget, sink);
        }
        let mut n = 0;
        let mut i = self.turn;
        for _ in 0..members {
            n += self.receive_from(i, budget - n, sink)?;
            i = if i + 1 == members { 0 } else { i + 1 };
        }
        Ok(n)
    }

    /// The wire's work for its peers (NICs do none).
    fn serve_peers(&mut self) -> usize {
        self.shm.as_mut().map_or(0, |s| s.serve_peers())
    }

    /// Every member's words: frames may come by any of them.
    fn rx_watch(&self, w: &mut RxWatches) {
        for i in 0..self.members() {
            match self.watches[i] {
                Some(kept) => w.push(kept),
                None => self.member(i).rx_watch(w),
            }
        }
    }

    /// A member has a frame (its kept word moved, or it says so); None if
    /// one cannot say and none has.
    fn rx_pending(&self) -> Option<bool> {
        // The wire first (the common case's member), by its own look.
        let mut blind = match self.shm.as_ref().map(|s| s.rx_pending()) {
            Some(Some(true)) => return Some(true),
            Some(None) => true,
            _ => false,
        };
        for (i, nic) in self.nics.iter().enumerate() {
            let pending = match self.watches[i] {
                Some(kept) => Some(kept.changed()),
                None => nic.dev.rx_pending(),
            };
            match pending {
                Some(true) => return Some(true),
                Some(false) => {}
                None => blind = true,
            }
        }
        (!blind).then_some(false)
    }

    /// Boxed messages go by the wire, to a process on it.
    fn box_route(&mut self, head: &[u8], vi: u16) -> Option<BoxRoute> {
        // (The wire's route asks it which ports take the frame.)
        self.shm.as_mut().and_then(|s| ShmDevice::box_route(s, head, vi))
    }

    fn transmit_boxed(&mut self, route: &BoxRoute, header: &[u8; BOX_HEADER_LEN], payload: &[u8]) -> io::Result<bool> {
        match self.shm.as_mut() {
            Some(s) => s.transmit_boxed(route, header, payload),
            None => Err(io::Error::new(io::ErrorKind::Unsupported, "a composite without a wire carries no boxed messages")),
        }
    }

    fn path_to(&mut self, head: &[u8]) -> Path {
        // The path of the member that carries such frames.
        if let Some(s) = self.shm.as_mut() {
            if s.takes(head) {
                return s.path_to(head);
            }
        }
        let dst = head.get(..6).map(|d| MacAddr(d.try_into().unwrap()));
        let CompositeDevice { nics, routes, .. } = self;
        let Some(host) = dst.and_then(|d| routes.get(&d)) else {
            return nics[0].dev.path_to(head);
        };
        // Striped: what every one of its ways carries.
        host.ways
            .iter()
            .map(|&(k, _)| nics[k].dev.path_to(head))
            .reduce(|p, q| Path { mtu: p.mtu.min(q.mtu), checksummed: p.checksummed && q.checksummed, both_ends: p.both_ends && q.both_ends, lends_from: None })
            .expect("a host in the table has a way")
    }

    /// Each frame's route is planned once; then, in chunks, the frames of
    /// each route go as one batch, in their order (a striped host's long
    /// frames alternate between its members). The count returned is the
    /// longest prefix of `frames` that went: a frame past it that went
    /// anyway is sent again by the engine, a duplicate its peer drops.
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        if let [f] = frames {
            // One frame (a message that fits one, an ACK): no plan; for a
            // process on the wire, no route either.
            if let Some(sent) = self.shm.as_mut().and_then(|s| s.transmit_taken(f)) {
                return sent.map(usize::from);
            }
            let route = self.route(f);
            return self.send_run(route, frames);
        }
        let mut plan = std::mem::take(&mut self.plan);
        plan.clear();
        plan.extend(frames.iter().map(|f| self.route(f)));
        let mut done = 0;
        let mut error = None;
        for (chunk, routes) in frames.chunks(REWRITE_CHUNK).zip(plan.chunks(REWRITE_CHUNK)) {
            let mut unsent = chunk.len(); // the first frame of the chunk that did not go
            let mut taken = [false; REWRITE_CHUNK];
            for i in 0..chunk.len() {
                if taken[i] {
                    continue;
                }
                let route = routes[i];
                let (mut batch, mut at) = ([TxFrame::new(&[]); REWRITE_CHUNK], [0usize; REWRITE_CHUNK]);
                let mut n = 0;
                for j in (i..chunk.len()).filter(|&j| routes[j] == route) {
                    (taken[j], batch[n], at[n]) = (true, chunk[j], j);
                    n += 1;
                }
                let sent = match self.send_run(route, &batch[..n]) {
                    Ok(k) => k,
                    Err(e) => {
                        error.get_or_insert(e);
                        0
                    }
                };
                if sent < n {
                    unsent = unsent.min(at[sent]);
                }
            }
            done += unsent;
            if unsent < chunk.len() {
                break;
            }
        }
        self.plan = plan;
        match error {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    fn map_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        for k in 0..self.nics.len() {
            if let Err(e) = self.nics[k].dev.map_memory(addr, len) {
                for n in &mut self.nics[..k] {
                    let _ = n.dev.unmap_memory(addr, len);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        let mut first_err = Ok(());
        for n in &mut self.nics {
            if let Err(e) = n.dev.unmap_memory(addr, len) {
                first_err = first_err.and(Err(e));
            }
        }
        first_err
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut s: Vec<_> = self.nics.iter().flat_map(|n| n.dev.stats()).collect();
        s.extend(self.shm.iter().flat_map(|w| w.stats()));
        s.extend(self.nics.iter().zip(TX_NAMES).map(|(n, name)| (name, n.tx)));
        s.push(("composite_nic_oversize", self.nic_oversize));
        s.push(("composite_unroutable", self.unroutable));
        s
    }

    /// Every member is told: the sleep is on all of them (the epoll set).
    fn prepare_sleep(&mut self) -> Option<Sleep> {
        let mut sleep = Sleep::default();
        for n in &mut self.nics {
            sleep = sleep.join(n.dev.prepare_sleep()?); // dropping `sleep` undoes the others
        }
        if let Some(s) = &mut self.shm {
            sleep = sleep.join(s.prepare_sleep()?);
        }
        Some(sleep)
    }
}

/// The epoll calls, each confining its `unsafe`.
mod sys {
    use super::*;

    /// An epoll set, readable when any of `fds` is.
    pub fn epoll(fds: &[RawFd]) -> io::Result<OwnedFd> {
        // SAFETY: plain epoll creation.
        let e = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if e < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `e` was just created and is ours.
        let owned = unsafe { OwnedFd::from_raw_fd(e) };
        for &fd in fds {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
            // SAFETY: adds a live descriptor with a live event struct.
            if unsafe { libc::epoll_ctl(e, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoopbackDevice;

    fn frame(dst: MacAddr, src: MacAddr, fill: u8) -> Vec<u8> {
        let mut f = vec![fill; 80];
        f[..6].copy_from_slice(&dst.0);
        f[6..12].copy_from_slice(&src.0);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f
    }

    fn recv_all(d: &mut dyn FrameDevice) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while d.receive(3, &mut |f| v.push(f.to_vec())).unwrap() > 0 {}
        v
    }

    fn nic(wire: &str) -> (String, Box<dyn FrameDevice>) {
        (format!("loop:{wire}"), Box::new(LoopbackDevice::open(wire).unwrap()))
    }

    /// Two composites share a wire; a third host is reachable only by the
    /// (loopback) NIC. Frames take the right member, in order, and the
    /// wait descriptor wakes for either.
    #[test]
    fn same_host_frames_take_the_wire_and_the_rest_the_nic() {
        let (lw, sw) = (format!("comp-{}", std::process::id()), format!("comp-{}", std::process::id()));
        let mut a = CompositeDevice::new(vec![nic(&lw)], Some(&sw), &[]).unwrap();
        let mut b = CompositeDevice::new(vec![nic(&lw)], Some(&sw), &[]).unwrap();
        let mut far = LoopbackDevice::open(&lw).unwrap();
        let (to_b, to_far) = (frame(b.mac(), a.mac(), 1), frame(far.mac(), a.mac(), 2));
        let batch: Vec<TxFrame> = [&to_b, &to_far, &to_b, &to_far].iter().map(|f| TxFrame::new(f)).collect();
        let mut pfd = libc::pollfd { fd: b.wait_fd(), events: libc::POLLIN, revents: 0 };
        let sleep = b.prepare_sleep().expect("b is about to sleep on every member");
        assert_eq!(a.transmit(&batch).unwrap(), 4);
        // SAFETY: poll on one live pollfd, no wait.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 1, "b's epoll set is readable");
        drop(sleep);
        assert!(b.prepare_sleep().is_none(), "frames wait in the wire's ring: do not sleep");
        assert_eq!(recv_all(&mut b), vec![to_b.clone(), to_b]);
        let stats = b.stats();
        assert!(stats.contains(&("shm_rx_frames", 2)) && stats.contains(&("rx_frames", 0)), "both came by shared memory: {stats:?}");
        assert_eq!(recv_all(&mut far), vec![to_far.clone(), to_far]);
        crate::shm::remove_wire(&sw);
    }

    /// Hosts a and b, each with two NICs on two networks (loopback
    /// wires); the hosts files route b through the second network. A
    /// frame to b's identity crosses the second network addressed to b's
    /// NIC there, and b's engine sees it from a's identity to its own;
    /// broadcasts cross both; an unrouted host is reached by the first.
    #[test]
    fn the_hosts_file_routes_a_host_through_another_nic() {
        let (n1, n2) = (format!("route1-{}", std::process::id()), format!("route2-{}", std::process::id()));
        let (a1, a2, b1, b2) = (nic(&n1), nic(&n2), nic(&n1), nic(&n2));
        let (ma1, ma2, mb1, mb2) = (a1.1.mac(), a2.1.mac(), b1.1.mac(), b2.1.mac());
        // As the hosts files `b {mb1} loop:{n2}={mb2}` and `a {ma1} loop:{n2}={ma2}` say.
        let hosts_a = [HostRoute { identity: mb1, device: format!("loop:{n2}"), there: mb2 }];
        let hosts_b = [HostRoute { identity: ma1, device: format!("loop:{n2}"), there: ma2 }];
        let mut a = CompositeDevice::new(vec![a1, a2], None, &hosts_a).unwrap();
        let mut b = CompositeDevice::new(vec![b1, b2], None, &hosts_b).unwrap();
        let mut c = LoopbackDevice::open(&n1).unwrap(); // unrouted, first network
        let mut spy = LoopbackDevice::open(&n2).unwrap(); // sees network 2's broadcasts
        assert_eq!((a.mac(), b.mac()), (ma1, mb1));
        let to_b = frame(mb1, ma1, 7);
        let to_c = frame(c.mac(), ma1, 8);
        let all = frame(MacAddr::BROADCAST, ma1, 9);
        assert_eq!(a.transmit(&[TxFrame::new(&to_b), TxFrame::new(&to_c), TxFrame::new(&all)]).unwrap(), 3);
        assert!(a.stats().contains(&("composite_tx_nic1", 1)), "{:?}", a.stats());
        assert!(a.stats().contains(&("composite_tx_nic0", 1)), "{:?}", a.stats());
        let got = recv_all(&mut b);
        assert!(got.contains(&to_b), "b sees the routed frame as from a's identity to its own: {got:?}");
        assert_eq!(got.iter().filter(|f| **f == all).count(), 2, "the broadcast came by both networks, as from a");
        assert_eq!(recv_all(&mut c), vec![to_c, all.clone()]);
        let mut renamed = all.clone();
        renamed[6..12].copy_from_slice(&ma2.0);
        assert_eq!(recv_all(&mut spy), vec![renamed], "on network 2 a's broadcast comes from a's NIC there");
        // The routed host's MTU is its NIC's; frames too long for it are dropped.
        assert_eq!(a.path_to(&to_b).mtu, b.nics[1].dev.mtu());
    }

    /// A host with two routes is striped: its long frames take the two
    /// networks in turn, its short ones the first; the other host gets
    /// every frame, addressed by identities, and both say they reorder.
    #[test]
    fn a_host_with_two_routes_is_striped() {
        let (n1, n2) = (format!("stripe1-{}", std::process::id()), format!("stripe2-{}", std::process::id()));
        let (a1, a2, b1, b2) = (nic(&n1), nic(&n2), nic(&n1), nic(&n2));
        let (ma1, ma2, mb1, mb2) = (a1.1.mac(), a2.1.mac(), b1.1.mac(), b2.1.mac());
        let route = |id, dev: &str, there| HostRoute { identity: id, device: dev.to_string(), there };
        let hosts_a = [route(mb1, &format!("loop:{n1}"), mb1), route(mb1, &format!("loop:{n2}"), mb2)];
        let hosts_b = [route(ma1, &format!("loop:{n1}"), ma1), route(ma1, &format!("loop:{n2}"), ma2)];
        let mut a = CompositeDevice::new(vec![a1, a2], None, &hosts_a).unwrap();
        let mut b = CompositeDevice::new(vec![b1, b2], None, &hosts_b).unwrap();
        assert!(a.capabilities().reorders && b.capabilities().reorders);
        let long: Vec<Vec<u8>> = (0..6u8)
            .map(|i| {
                let mut f = frame(mb1, ma1, i);
                f.resize(STRIPE_MIN + 100, i);
                f
            })
            .collect();
        let short = frame(mb1, ma1, 99);
        // Header and payload apart, as the engine gathers them.
        let mut batch: Vec<TxFrame> = long
            .iter()
            .map(|f| {
                let mut t = TxFrame::new(&f[..64]);
                t.push(&f[64..]);
                t
            })
            .collect();
        batch.push(TxFrame::new(&short));
        assert_eq!(a.transmit(&batch).unwrap(), 7);
        let stats = a.stats();
        assert!(stats.contains(&("composite_tx_nic0", 4)) && stats.contains(&("composite_tx_nic1", 3)), "three long frames each way, the short one first: {stats:?}");
        let mut got = recv_all(&mut b);
        got.sort_by_key(|f| f[20]);
        let mut want = long.clone();
        want.push(short);
        assert_eq!(got, want, "every frame arrives, as from a's identity to b's");
        // One way's MTU for all: the smaller of the two.
        assert_eq!(a.path_to(&long[0]).mtu, a.nics[0].dev.mtu().min(a.nics[1].dev.mtu()));
        // A host with one route is not striped.
        let c = CompositeDevice::new(vec![nic(&n1), nic(&n2)], None, &hosts_a[1..]).unwrap();
        assert!(!c.capabilities().reorders);
    }

    /// Frames for a [`WatchedNic`], and their count (its watched word).
    #[derive(Default)]
    struct Inbox {
        frames: std::sync::Mutex<std::collections::VecDeque<Vec<u8>>>,
        arrived: std::sync::atomic::AtomicU64,
        /// Receives asked of the NIC.
        asked: std::sync::atomic::AtomicUsize,
    }

    impl Inbox {
        fn arrive(&self, f: Vec<u8>) {
            self.frames.lock().unwrap().push_back(f);
            self.arrived.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }

    /// A NIC that says where its next frame shows (its inbox's count).
    struct WatchedNic {
        mac: MacAddr,
        inbox: std::sync::Arc<Inbox>,
        fd: via_device::EventFd,
    }

    impl FrameDevice for WatchedNic {
        fn mac(&self) -> MacAddr {
            self.mac
        }
        fn mtu(&self) -> usize {
            1500
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }
        fn wait_fd(&self) -> RawFd {
            self.fd.as_raw_fd()
        }
        fn set_filter(&mut self, _: RxFilter) -> io::Result<()> {
            Ok(())
        }
        fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
            self.inbox.asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut n = 0;
            while n < budget {
                let Some(f) = self.inbox.frames.lock().unwrap().pop_front() else { break };
                sink(&f);
                n += 1;
            }
            Ok(n)
        }
        fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
            Ok(frames.len())
        }
        fn rx_watch(&self, w: &mut RxWatches) {
            let now = self.inbox.arrived.load(std::sync::atomic::Ordering::Acquire);
            if !self.inbox.frames.lock().unwrap().is_empty() {
                w.ready();
            }
            // SAFETY: the counter lives in the inbox, which the device holds.
            w.push(unsafe { RxWatch::u64(&self.inbox.arrived, now) });
        }
    }

    /// A member that found nothing is not asked again until its watched
    /// word moves; then its frame is taken at the next receive.
    #[test]
    fn a_member_that_found_nothing_is_asked_again_only_when_its_word_moves() {
        let inbox = std::sync::Arc::new(Inbox::default());
        let watched = WatchedNic { mac: MacAddr([2, 0, 0, 0, 0, 0x77]), inbox: inbox.clone(), fd: via_device::EventFd::new().unwrap() };
        let mut c = CompositeDevice::new(vec![("watched".into(), Box::new(watched))], None, &[]).unwrap();
        let asked = || inbox.asked.load(std::sync::atomic::Ordering::Relaxed);
        for _ in 0..10 {
            assert_eq!(c.receive_lent(8, &mut |_, _| panic!("no frame yet")).unwrap(), 0);
        }
        assert_eq!(asked(), 1, "asked once, then watched");
        let mut w = RxWatches::default();
        c.rx_watch(&mut w);
        assert!(w.usable() && !w.changed(), "the composite's watch is the member's word");
        assert_eq!(c.rx_pending(), Some(false), "nothing there, and it can say so");
        let f = frame(c.mac(), MacAddr([2, 0, 0, 0, 0, 1]), 5);
        inbox.arrive(f.clone());
        assert!(w.changed(), "a frame moves the watched word");
        assert_eq!(c.rx_pending(), Some(true));
        let mut got = Vec::new();
        assert_eq!(c.receive_lent(8, &mut |g, _| got.push(g.to_vec())).unwrap(), 1);
        assert_eq!((got, asked()), (vec![f], 2));
    }

    /// The wire's doorbell, rung for a sleeper, is emptied by the first
    /// receive that finds its ring empty. So a member is watched only after
    /// a receive that found nothing, not after one that gave frames: else
    /// that receive never comes, the wait descriptor stays readable and
    /// every sleep ends at once.
    #[test]
    fn a_rung_doorbell_is_emptied_though_the_wire_gave_its_frame() {
        let (lw, sw) = (format!("bell-{}", std::process::id()), format!("bell-{}", std::process::id()));
        let mut a = CompositeDevice::new(vec![nic(&lw)], Some(&sw), &[]).unwrap();
        let mut b = CompositeDevice::new(vec![nic(&lw)], Some(&sw), &[]).unwrap();
        let to_b = frame(b.mac(), a.mac(), 3);
        assert_eq!(recv_all(&mut b), Vec::<Vec<u8>>::new(), "nothing yet: the wire is watched");
        let sleep = b.prepare_sleep().expect("nothing waits");
        assert_eq!(a.transmit(&[TxFrame::new(&to_b)]).unwrap(), 1); // rings b's doorbell
        drop(sleep);
        assert_eq!(b.rx_pending(), Some(true), "the wire has a frame");
        assert_eq!(recv_all(&mut b), vec![to_b]);
        assert_eq!(b.shm.as_ref().unwrap().rx_pending(), Some(false));
        assert_eq!(b.rx_pending(), None, "nothing on the wire, and the loopback NIC cannot say");
        let mut pfd = libc::pollfd { fd: b.wait_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one live pollfd, no wait.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0, "the doorbell was emptied: a sleep would sleep");
        crate::shm::remove_wire(&sw);
    }
}
