//! Peer-to-peer connections (`VipConnectPeerRequest` / `Done` / `Wait`),
//! as a sans-IO state machine like [`crate::conn::ConnectionManager`].
//!
//! Both sides request: each names its own discriminator and the one of the
//! peer it seeks, and sends `PeerRequest` to the peer's MAC (endpoint
//! [`ANY_ENDPOINT`]) with backoff until its deadline. Two requests match
//! when each seeks the other's discriminator at the other's MAC.
//!
//! One side decides, so that both agree on one connection: the side whose
//! (MAC, endpoint) is lower. When a matching request reaches the decider
//! it checks the attributes (the other side does the same check on the
//! decider's request), picks the connection generation, and answers
//! `PeerAccept`; it answers every duplicate request with the same accept,
//! so a lost accept is made good by the other side's next retransmission.
//! The other side connects when the accept arrives. An attribute mismatch
//! ends the request with the reason on the side that found it and is
//! answered with `ConnReject` carrying the reason, which ends the other's.
//! An answer (`PeerAccept`, `ConnReject`) naming our request is taken only
//! from the peer asked (its MAC, a real endpoint); from anyone else it is
//! [`Foreign`] and changes nothing.

use crate::conn::{answered_by_asked, CmFrame, Foreign, Peer, RejectReason, RequestState, REQUEST_RTO, REQUEST_RTO_MAX};
use crate::backoff::{Backoff, Due, Retried, RetryTable};
use via_wire::MacAddr;
use crate::memory::random_u32;
use via_wire::{ConnRepr, Kind, ANY_ENDPOINT};
use std::time::Instant;

/// Accepts remembered for duplicate requests.
const ACCEPTS_KEPT: usize = 64;

/// The attribute check both connection models make: reliability level,
/// MaxTransferSize and RDMA read enable must be equal.
pub fn compatible(mine: &ConnRepr, theirs: &ConnRepr) -> Result<(), RejectReason> {
    if mine.reliability != theirs.reliability {
        Err(RejectReason::ReliabilityLevel)
    } else if mine.max_transfer_size != theirs.max_transfer_size {
        Err(RejectReason::Mtu)
    } else if mine.enable_rdma_read != theirs.enable_rdma_read {
        Err(RejectReason::RdmaRead)
    } else {
        Ok(())
    }
}

struct PeerRequest {
    vi: u16,
    mac: MacAddr,
    /// Our attributes; `discriminator` is ours, `peer_discriminator` the
    /// one sought; `request_id` a nonce of this request.
    attrs: ConnRepr,
    state: RequestState,
}

impl Retried for PeerRequest {
    fn in_progress(&self) -> bool {
        self.state == RequestState::InProgress
    }
}

/// Unsought requests remembered at most (the newest replace the oldest).
const WAITING_KEPT: usize = 256;

/// A peer's request that no VI here seeks (yet): who asks, under which
/// discriminator, for which of ours. It keeps retransmitting; a program
/// that connects on demand answers it by requesting in turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingRequest {
    pub mac: MacAddr,
    /// The requester's own discriminator, and the one it seeks here.
    pub discriminator: Vec<u8>,
    pub seeks: Vec<u8>,
}

/// An accept given, for answering duplicates: (their MAC, endpoint, VI,
/// nonce) and the frame.
struct Given {
    key: (MacAddr, u32, u16, u32),
    frame: CmFrame,
}

/// The peer-to-peer requests of one opened NIC.
pub struct PeerConnector {
    mac: MacAddr,
    ep: u32,
    requests: RetryTable<PeerRequest>,
    given: Vec<Given>,
    out: Vec<CmFrame>,
    /// Requests nobody here seeks, since last taken ([`Self::take_waiting`]).
    waiting: Vec<WaitingRequest>,
}

impl PeerConnector {
    pub fn new(mac: MacAddr, ep: u32) -> Self {
        PeerConnector { mac, ep, requests: RetryTable::default(), given: Vec::new(), out: Vec::new(), waiting: Vec::new() }
    }

    /// Has a request that nobody here seeks come since last taken?
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The requests that nobody here sought when they came, since the
    /// last call (each once, however often it was retransmitted).
    pub fn take_waiting(&mut self) -> Vec<WaitingRequest> {
        std::mem::take(&mut self.waiting)
    }

    /// Frames queued for transmission; the engine drains them.
    pub fn outgoing(&mut self) -> &mut Vec<CmFrame> {
        &mut self.out
    }

    /// Starts a request of local VI `vi` for the peer at `mac` whose
    /// discriminator is `attrs.peer_discriminator` (ours is
    /// `attrs.discriminator`), giving up at `deadline`.
    pub fn begin(&mut self, vi: u16, mac: MacAddr, mut attrs: ConnRepr, now: Instant, deadline: Instant) {
        attrs.request_id = random_u32();
        let backoff = Backoff::new(now, deadline, REQUEST_RTO, REQUEST_RTO_MAX);
        self.requests.start(backoff, PeerRequest { vi, mac, attrs, state: RequestState::InProgress }, |r| r.vi == vi);
        self.on_timer(now);
    }

    /// Where the request of `vi` stands; a finished request is forgotten.
    pub fn poll(&mut self, vi: u16, now: Instant) -> RequestState {
        self.on_timer(now);
        self.requests.poll(|r| r.vi == vi, |r| r.state.clone()).unwrap_or(RequestState::TimedOut)
    }

    /// The peer the request of `vi` was accepted with (we decided, or its
    /// accept came), while that waits for [`Self::poll`].
    pub fn accepted(&self, vi: u16) -> Option<&Peer> {
        self.requests.find(|r| r.vi == vi)?.state.accepted()
    }

    /// Has the request of `vi` passed its deadline (or is there none)?
    pub fn expired(&mut self, vi: u16, now: Instant) -> bool {
        self.requests.find_scheduled_mut(|r| r.vi == vi).is_none_or(|(b, _)| b.expired(now))
    }

    /// Abandons the request of `vi` and forgets accepts given for it.
    pub fn cancel(&mut self, vi: u16) {
        self.requests.remove_where(|r| r.vi == vi);
        self.given.retain(|g| g.frame.src_vi != vi);
    }

    /// Do we decide the connection with the endpoint `(mac, ep)`?
    fn decides(&self, mac: MacAddr, ep: u32) -> bool {
        (self.mac.0, self.ep) < (mac.0, ep)
    }

    /// A `PeerRequest` from `(mac, ep, vi)`.
    pub fn on_request(&mut self, mac: MacAddr, ep: u32, vi: u16, theirs: ConnRepr) {
        let key = (mac, ep, vi, theirs.request_id);
        if let Some(g) = self.given.iter().find(|g| g.key == key) {
            self.out.push(g.frame.clone()); // our accept was lost
            return;
        }
        let decides = self.decides(mac, ep);
        let Some(r) = self.requests.find_in_progress_mut(|r| r.mac == mac && r.attrs.peer_discriminator == theirs.discriminator && r.attrs.discriminator == theirs.peer_discriminator) else {
            // Nobody here seeks that peer (yet): it retransmits. Noted for
            // a program that connects on demand.
            let w = WaitingRequest { mac, discriminator: theirs.discriminator, seeks: theirs.peer_discriminator };
            if !self.waiting.contains(&w) {
                if self.waiting.len() == WAITING_KEPT {
                    self.waiting.remove(0);
                }
                self.waiting.push(w);
            }
            return;
        };
        if let Err(reason) = compatible(&r.attrs, &theirs) {
            r.state = RequestState::Rejected(reason);
            let conn = ConnRepr { request_id: theirs.request_id, ..ConnRepr::default() };
            self.out.push(CmFrame { dst_mac: mac, dst_ep: ep, kind: Kind::ConnReject, dst_vi: vi, src_vi: r.vi, generation: 0, imm: reason as u32, ack: None, conn });
            return;
        }
        if !decides {
            return; // the other side decides; keep asking until it accepts
        }
        let generation = random_u32() | 1;
        let mut mine = r.attrs.clone();
        mine.request_id = theirs.request_id;
        mine.discriminator.clear();
        mine.peer_discriminator.clear();
        let frame = CmFrame { dst_mac: mac, dst_ep: ep, kind: Kind::PeerAccept, dst_vi: vi, src_vi: r.vi, generation, imm: 0, ack: None, conn: mine };
        r.state = RequestState::Accepted(Peer { mac, ep, vi, generation, attrs: theirs });
        self.out.push(frame.clone());
        if self.given.len() == ACCEPTS_KEPT {
            self.given.remove(0);
        }
        self.given.push(Given { key, frame });
    }

    /// A `PeerAccept` (or `ConnReject`) from `(mac, ep, vi)` for our
    /// request `conn.request_id`; [`Foreign`] when it names our request
    /// but does not come from the peer asked.
    #[allow(clippy::too_many_arguments)]
    pub fn on_answer(&mut self, kind: Kind, mac: MacAddr, ep: u32, vi: u16, generation: u32, imm: u32, conn: ConnRepr) -> Result<(), Foreign> {
        let Some(r) = self.requests.find_in_progress_mut(|r| r.attrs.request_id == conn.request_id) else {
            return Ok(());
        };
        if !answered_by_asked(r.mac, mac, ep) {
            return Err(Foreign);
        }
        r.state = match kind {
            Kind::PeerAccept => RequestState::Accepted(Peer { mac, ep, vi, generation, attrs: conn }),
            _ => RequestState::Rejected(RejectReason::from_u32(imm)),
        };
        Ok(())
    }

    /// Nothing timed: [`Self::on_timer`] would do nothing.
    pub fn timers_idle(&self) -> bool {
        self.requests.is_empty()
    }

    /// Retransmits requests that are due and times out those whose
    /// deadline passed.
    #[inline]
    pub fn on_timer(&mut self, now: Instant) {
        if !self.timers_idle() {
            self.on_timer_requests(now);
        }
    }

    fn on_timer_requests(&mut self, now: Instant) {
        let out = &mut self.out;
        self.requests.on_timer(now, |_| {}, |r, due| match due {
            Due::Expired => r.state = RequestState::TimedOut,
            Due::Send => out.push(CmFrame { dst_mac: r.mac, dst_ep: ANY_ENDPOINT, kind: Kind::PeerRequest, dst_vi: 0, src_vi: r.vi, generation: 0, imm: 0, ack: None, conn: r.attrs.clone() }),
        });
    }

    /// The next instant [`PeerConnector::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.requests.next_deadline(|_| None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn attrs(mine: &[u8], theirs: &[u8]) -> ConnRepr {
        ConnRepr { reliability: 2, max_transfer_size: 1 << 20, mtu: 1500, discriminator: mine.to_vec(), peer_discriminator: theirs.to_vec(), ..Default::default() }
    }

    /// Delivers `from`'s queued frames to `to`, dropping the first `drop`.
    fn pump(from: &mut PeerConnector, to: &mut PeerConnector, drop: usize) -> usize {
        let frames: Vec<_> = from.outgoing().drain(..).collect();
        let n = frames.len();
        for f in frames.into_iter().skip(drop) {
            // The wire round trip: what the engine does.
            let mut buf = [0u8; 160];
            let len = f.conn.emit(&mut buf);
            let conn = ConnRepr::parse(&buf[..len]).unwrap();
            match f.kind {
                Kind::PeerRequest => to.on_request(from.mac, from.ep, f.src_vi, conn),
                k => to.on_answer(k, from.mac, from.ep, f.src_vi, f.generation, f.imm, conn).expect("from the peer asked"),
            }
        }
        n
    }

    fn accepted(s: RequestState) -> Peer {
        match s {
            RequestState::Accepted(p) => p,
            s => panic!("not accepted: {s:?}"),
        }
    }

    #[test]
    fn both_sides_connect_to_each_other_with_one_generation() {
        let t0 = Instant::now();
        let (mut a, mut b) = (PeerConnector::new(A, 10), PeerConnector::new(B, 20));
        let dl = t0 + Duration::from_secs(1);
        a.begin(3, B, attrs(b"a", b"b"), t0, dl);
        b.begin(5, A, attrs(b"b", b"a"), t0, dl);
        pump(&mut a, &mut b, 0); // b does not decide: waits
        assert_eq!(b.poll(5, t0), RequestState::InProgress);
        pump(&mut b, &mut a, 0); // a decides and accepts
        let pa = accepted(a.poll(3, t0));
        pump(&mut a, &mut b, 0);
        let pb = accepted(b.poll(5, t0));
        assert_eq!((pa.mac, pa.ep, pa.vi), (B, 20, 5));
        assert_eq!((pb.mac, pb.ep, pb.vi), (A, 10, 3));
        assert_eq!(pa.generation, pb.generation);
    }

    /// An accept or reject naming our request from another host (or
    /// from no endpoint) is foreign: the request goes on, and the peer
    /// asked still connects.
    #[test]
    fn an_answer_from_another_host_is_foreign() {
        const M: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
        let t0 = Instant::now();
        let (mut a, mut b) = (PeerConnector::new(A, 10), PeerConnector::new(B, 20));
        let dl = t0 + Duration::from_secs(1);
        a.begin(3, B, attrs(b"a", b"b"), t0, dl);
        b.begin(5, A, attrs(b"b", b"a"), t0, dl);
        let id = b.requests.find_mut(|_| true).unwrap().attrs.request_id;
        let named = ConnRepr { request_id: id, ..ConnRepr::default() };
        assert_eq!(b.on_answer(Kind::PeerAccept, M, 10, 3, 77, 0, named.clone()), Err(Foreign));
        assert_eq!(b.on_answer(Kind::ConnReject, M, 10, 3, 0, 0, named.clone()), Err(Foreign));
        assert_eq!(b.on_answer(Kind::PeerAccept, A, ANY_ENDPOINT, 3, 77, 0, named), Err(Foreign));
        assert_eq!(b.poll(5, t0), RequestState::InProgress);
        pump(&mut b, &mut a, 0);
        pump(&mut a, &mut b, 0);
        let pb = accepted(b.poll(5, t0));
        assert_eq!((pb.mac, pb.ep, pb.vi), (A, 10, 3));
        assert_ne!(pb.generation, 77);
    }

    #[test]
    fn a_lost_accept_is_given_again() {
        let t0 = Instant::now();
        let (mut a, mut b) = (PeerConnector::new(A, 10), PeerConnector::new(B, 20));
        let dl = t0 + Duration::from_secs(1);
        a.begin(3, B, attrs(b"a", b"b"), t0, dl);
        b.begin(5, A, attrs(b"b", b"a"), t0, dl);
        a.outgoing().clear();
        pump(&mut b, &mut a, 0);
        let pa = accepted(a.poll(3, t0));
        pump(&mut a, &mut b, 1); // the accept is lost
        let t1 = t0 + REQUEST_RTO;
        b.on_timer(t1);
        pump(&mut b, &mut a, 0); // duplicate request
        pump(&mut a, &mut b, 0);
        assert_eq!(accepted(b.poll(5, t1)).generation, pa.generation);
    }

    #[test]
    fn mismatched_discriminators_do_not_match_and_time_out() {
        let t0 = Instant::now();
        let (mut a, mut b) = (PeerConnector::new(A, 10), PeerConnector::new(B, 20));
        let dl = t0 + Duration::from_millis(50);
        a.begin(3, B, attrs(b"a", b"b"), t0, dl);
        b.begin(5, A, attrs(b"b", b"someone else"), t0, dl);
        pump(&mut a, &mut b, 0);
        pump(&mut b, &mut a, 0);
        pump(&mut a, &mut b, 0);
        assert_eq!(a.poll(3, t0), RequestState::InProgress);
        assert_eq!(a.poll(3, dl), RequestState::TimedOut);
        assert_eq!(b.poll(5, dl), RequestState::TimedOut);
    }

    #[test]
    fn mismatched_attributes_reject_both_sides() {
        let t0 = Instant::now();
        let (mut a, mut b) = (PeerConnector::new(A, 10), PeerConnector::new(B, 20));
        let dl = t0 + Duration::from_secs(1);
        a.begin(3, B, attrs(b"a", b"b"), t0, dl);
        b.begin(5, A, ConnRepr { reliability: 1, ..attrs(b"b", b"a") }, t0, dl);
        a.outgoing().clear(); // only b's request arrives
        pump(&mut b, &mut a, 0);
        assert_eq!(a.poll(3, t0), RequestState::Rejected(RejectReason::ReliabilityLevel));
        pump(&mut a, &mut b, 0); // the reject
        assert_eq!(b.poll(5, t0), RequestState::Rejected(RejectReason::ReliabilityLevel));
    }
}
