//! The connection manager of the client/server model, as a sans-IO state
//! machine: the engine feeds it connection-management frames and the clock,
//! and transmits the frames it queues in [`ConnectionManager::outgoing`].
//!
//! Protocol (frame kinds in [`via_wire::Kind`]):
//! - The client sends `ConnRequest` to the server's MAC, endpoint
//!   [`ANY_ENDPOINT`], carrying its VI attributes, a request id and the
//!   discriminator. It retransmits with backoff until an answer or its
//!   deadline.
//! - An endpoint with a `ConnectWait` on that discriminator answers
//!   `ConnPending` and hands the request to the application as a connection
//!   handle; endpoints without one answer `ConnNoMatch`. The client reports
//!   `NO_MATCH` when it heard only `ConnNoMatch` for [`NO_MATCH_GRACE`].
//! - `Accept` answers `ConnAccept` (with the server VI, its attributes and
//!   the new connection generation), `Reject` answers `ConnReject` with a
//!   reason. A duplicate request gets the same answer again.
//!
//! An answer (`ConnPending`, `ConnAccept`, `ConnReject`, `ConnNoMatch`)
//! is taken only from the host asked: the MAC the request went to, from a
//! real endpoint there (the request went to any endpoint of that host, so
//! any one of them may answer). An answer naming our request from anyone
//! else is [`Foreign`]: the engine counts it and it changes nothing.
//!
//! The peer-to-peer model (`VipConnectPeerRequest`) is
//! [`PeerConnector`](crate::peer::PeerConnector) in [`crate::peer`], with
//! the attribute check both models make,
//! [`compatible`](crate::peer::compatible). It shares this module's
//! [`Peer`], [`RequestState`], [`RejectReason`] and retransmission schedule
//! ([`REQUEST_RTO`] doubling to [`REQUEST_RTO_MAX`]). The models never match
//! each other: a `ConnRequest` reaches only `ConnectWait`s here, and a
//! `PeerRequest` only peer requests there (this manager ignores it without
//! an answer, whatever its discriminator).

use crate::backoff::{Backoff, Due, Retried, RetryTable};
use via_wire::MacAddr;
use crate::memory::random_u32;
use via_wire::{ConnRepr, Kind, ANY_ENDPOINT};
use std::time::{Duration, Instant};

/// First retransmission interval of a connection request.
pub const REQUEST_RTO: Duration = Duration::from_millis(5);
/// Longest interval between retransmissions of a request.
pub const REQUEST_RTO_MAX: Duration = Duration::from_millis(200);
/// How long a client waits, after a `ConnNoMatch`, for another endpoint of
/// the same host to answer positively before reporting NO_MATCH.
pub const NO_MATCH_GRACE: Duration = Duration::from_millis(20);
/// Answers remembered for duplicate requests.
const ANSWERS_KEPT: usize = 256;

/// Why a request was rejected (carried in the `imm` field of `ConnReject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The server application said no.
    Refused = 0,
    ReliabilityLevel = 1,
    Mtu = 2,
    RdmaRead = 3,
    /// One host has a cluster secret and the other not, or another one
    /// (sent without authentication: see `crate::auth`).
    Authentication = 4,
}

impl RejectReason {
    pub fn from_u32(v: u32) -> RejectReason {
        match v {
            1 => RejectReason::ReliabilityLevel,
            2 => RejectReason::Mtu,
            3 => RejectReason::RdmaRead,
            4 => RejectReason::Authentication,
            _ => RejectReason::Refused,
        }
    }
}

/// The far end of a connection, as both sides learn it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub mac: MacAddr,
    pub ep: u32,
    pub vi: u16,
    pub generation: u32,
    /// The remote VI's attributes.
    pub attrs: ConnRepr,
}

/// A connection-management frame to transmit.
#[derive(Clone, Debug)]
pub struct CmFrame {
    pub dst_mac: MacAddr,
    pub dst_ep: u32,
    pub kind: Kind,
    pub dst_vi: u16,
    pub src_vi: u16,
    pub generation: u32,
    /// Reject reason, for `ConnReject`.
    pub imm: u32,
    /// Cumulative ACK carried by a `Disconnect` of a reliable VI, so data
    /// the peer sent before the disconnect still completes there.
    pub ack: Option<u32>,
    pub conn: ConnRepr,
}

/// An answer to one of our requests that came from a host other than the
/// one asked (or from no endpoint): the engine counts it (`rx_cm_foreign`)
/// and drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Foreign;

/// Is `(mac, ep)` the host a request to `asked` may be answered by?
pub(crate) fn answered_by_asked(asked: MacAddr, mac: MacAddr, ep: u32) -> bool {
    mac == asked && ep != ANY_ENDPOINT
}

/// The header fields of a received connection-management frame.
#[derive(Clone, Copy, Debug)]
pub struct CmHeader {
    pub kind: Kind,
    pub src_mac: MacAddr,
    pub src_ep: u32,
    pub src_vi: u16,
    pub dst_vi: u16,
    pub generation: u32,
    pub imm: u32,
}

/// A received request handed to the server application (`VIP_CONN_HANDLE`).
#[derive(Clone, Debug)]
pub struct Incoming {
    pub id: u32,
    pub mac: MacAddr,
    pub ep: u32,
    pub vi: u16,
    pub attrs: ConnRepr,
}

/// Where a client's request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    InProgress,
    Accepted(Peer),
    Rejected(RejectReason),
    NoMatch,
    TimedOut,
}

impl RequestState {
    /// The peer, once accepted.
    pub fn accepted(&self) -> Option<&Peer> {
        match self {
            RequestState::Accepted(p) => Some(p),
            _ => None,
        }
    }
}

struct Wait {
    id: u32,
    discriminator: Vec<u8>,
    matched: Option<u32>,
}

struct Request {
    vi: u16,
    mac: MacAddr,
    attrs: ConnRepr,
    /// A positive sign (pending) was heard: keep waiting until the deadline.
    pending: bool,
    no_match_since: Option<Instant>,
    /// NO_MATCH does not end it: the same request is repeated until a
    /// ConnectWait matches it or the deadline passes.
    until_matched: bool,
    state: RequestState,
}

impl Retried for Request {
    fn in_progress(&self) -> bool {
        self.state == RequestState::InProgress
    }
}

#[derive(Clone)]
struct Answer {
    key: (MacAddr, u32, u16, u32),
    frame: CmFrame,
}

/// Connection manager of one opened NIC.
pub struct ConnectionManager {
    mac: MacAddr,
    ep: u32,
    waits: Vec<Wait>,
    incoming: Vec<Incoming>,
    requests: RetryTable<Request>,
    answers: Vec<Answer>,
    next_id: u32,
    out: Vec<CmFrame>,
}

fn key(i: &Incoming) -> (MacAddr, u32, u16, u32) {
    (i.mac, i.ep, i.vi, i.attrs.request_id)
}

impl ConnectionManager {
    pub fn new(mac: MacAddr, ep: u32) -> Self {
        ConnectionManager { mac, ep, waits: Vec::new(), incoming: Vec::new(), requests: RetryTable::default(), answers: Vec::new(), next_id: 1, out: Vec::new() }
    }

    /// Frames queued for transmission; the engine drains them.
    pub fn outgoing(&mut self) -> &mut Vec<CmFrame> {
        &mut self.out
    }

    /// Are frames waiting to be transmitted (the device took only part of
    /// a batch: they go with the next progress)?
    pub fn has_outgoing(&self) -> bool {
        !self.out.is_empty()
    }

    // ---- server side ----

    /// Starts a `ConnectWait` on `discriminator`; returns its id.
    pub fn wait_begin(&mut self, discriminator: &[u8]) -> u32 {
        let id = self.fresh_id();
        self.waits.push(Wait { id, discriminator: discriminator.to_vec(), matched: None });
        id
    }

    /// The connection handle a wait matched, if any (ends the wait).
    pub fn wait_take(&mut self, wait: u32) -> Option<&Incoming> {
        let i = self.waits.iter().position(|w| w.id == wait)?;
        let conn = self.waits[i].matched?;
        self.waits.remove(i);
        self.incoming.iter().find(|c| c.id == conn)
    }

    /// Ends a wait that timed out or was abandoned.
    pub fn wait_end(&mut self, wait: u32) {
        self.waits.retain(|w| w.id != wait);
    }

    pub fn incoming(&self, conn: u32) -> Option<&Incoming> {
        self.incoming.iter().find(|c| c.id == conn)
    }

    /// Accepts request `conn` for local VI `vi` with local attributes
    /// `attrs`; returns the peer for the VI to connect to.
    pub fn accept(&mut self, conn: u32, vi: u16, attrs: &ConnRepr) -> Option<Peer> {
        let i = self.incoming.iter().position(|c| c.id == conn)?;
        let req = self.incoming.remove(i);
        let generation = random_u32() | 1;
        let mut mine = attrs.clone();
        mine.request_id = req.attrs.request_id;
        mine.discriminator.clear();
        let frame = CmFrame { dst_mac: req.mac, dst_ep: req.ep, kind: Kind::ConnAccept, dst_vi: req.vi, src_vi: vi, generation, imm: 0, ack: None, conn: mine };
        self.answer(key(&req), frame);
        Some(Peer { mac: req.mac, ep: req.ep, vi: req.vi, generation, attrs: req.attrs })
    }

    /// Rejects request `conn`.
    pub fn reject(&mut self, conn: u32, reason: RejectReason) -> bool {
        let Some(i) = self.incoming.iter().position(|c| c.id == conn) else { return false };
        let req = self.incoming.remove(i);
        let conn = ConnRepr { request_id: req.attrs.request_id, ..ConnRepr::default() };
        let frame = CmFrame { dst_mac: req.mac, dst_ep: req.ep, kind: Kind::ConnReject, dst_vi: req.vi, src_vi: 0, generation: 0, imm: reason as u32, ack: None, conn };
        self.answer(key(&req), frame);
        true
    }

    fn answer(&mut self, key: (MacAddr, u32, u16, u32), frame: CmFrame) {
        self.out.push(frame.clone());
        if self.answers.len() == ANSWERS_KEPT {
            self.answers.remove(0);
        }
        self.answers.push(Answer { key, frame });
    }

    /// Forgets answers given on behalf of local VI `vi` (it is gone).
    pub fn forget_vi(&mut self, vi: u16) {
        self.answers.retain(|a| !(a.frame.kind == Kind::ConnAccept && a.frame.src_vi == vi));
        self.requests.remove_where(|r| r.vi == vi);
    }

    // ---- client side ----

    /// Starts a request from local VI `vi` to `mac` (attributes and the
    /// server's discriminator in `attrs`), giving up at `deadline`.
    pub fn request_begin(&mut self, vi: u16, mac: MacAddr, mut attrs: ConnRepr, now: Instant, deadline: Instant) {
        attrs.request_id = random_u32();
        let backoff = Backoff::new(now, deadline, REQUEST_RTO, REQUEST_RTO_MAX);
        self.requests.start(backoff, Request { vi, mac, attrs, pending: false, no_match_since: None, until_matched: false, state: RequestState::InProgress }, |r| r.vi == vi);
        self.on_timer(now);
    }

    /// Makes the request of `vi` outlast NO_MATCH answers: it is repeated
    /// (at least every [`NO_MATCH_GRACE`]) until a ConnectWait matches it or
    /// its deadline passes. Retrying with one request, rather than a new
    /// one after each NO_MATCH, means a late copy of an earlier attempt
    /// cannot be matched and accepted at the server after the client has
    /// given that attempt up (which left the server's VI connected to
    /// nobody).
    pub fn request_until_matched(&mut self, vi: u16) {
        if let Some((schedule, r)) = self.requests.find_scheduled_mut(|r| r.vi == vi) {
            r.until_matched = true;
            schedule.cap(NO_MATCH_GRACE);
        }
    }

    /// Where the request of `vi` stands; a finished request is forgotten.
    pub fn request_poll(&mut self, vi: u16, now: Instant) -> RequestState {
        self.on_timer(now);
        self.requests.poll(|r| r.vi == vi, |r| r.state.clone()).unwrap_or(RequestState::TimedOut)
    }

    /// The peer the request of `vi` was accepted by, while that answer
    /// waits for [`Self::request_poll`].
    pub fn accepted(&self, vi: u16) -> Option<&Peer> {
        self.requests.find(|r| r.vi == vi)?.state.accepted()
    }

    /// Abandons the request of `vi`.
    pub fn request_cancel(&mut self, vi: u16) {
        self.requests.remove_where(|r| r.vi == vi);
    }

    // ---- input and time ----

    /// Handles a connection-management frame addressed to us; an answer
    /// to one of our requests from anyone but the host asked is
    /// [`Foreign`] and changes nothing.
    pub fn on_frame(&mut self, h: CmHeader, conn: ConnRepr, now: Instant) -> Result<(), Foreign> {
        let CmHeader { kind, src_mac, src_ep, src_vi, dst_vi, generation, imm } = h;
        match kind {
            Kind::ConnRequest => self.on_request(src_mac, src_ep, src_vi, conn),
            Kind::ConnPending | Kind::ConnAccept | Kind::ConnReject | Kind::ConnNoMatch => {
                let Some(r) = self.requests.find_in_progress_mut(|r| r.vi == dst_vi && r.attrs.request_id == conn.request_id) else {
                    return Ok(());
                };
                if !answered_by_asked(r.mac, src_mac, src_ep) {
                    return Err(Foreign);
                }
                match kind {
                    Kind::ConnPending => r.pending = true,
                    Kind::ConnNoMatch => {
                        r.no_match_since.get_or_insert(now);
                    }
                    Kind::ConnAccept => {
                        r.state = RequestState::Accepted(Peer { mac: src_mac, ep: src_ep, vi: src_vi, generation, attrs: conn });
                    }
                    _ => r.state = RequestState::Rejected(RejectReason::from_u32(imm)),
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_request(&mut self, mac: MacAddr, ep: u32, vi: u16, conn: ConnRepr) {
        let k = (mac, ep, vi, conn.request_id);
        if let Some(a) = self.answers.iter().find(|a| a.key == k) {
            self.out.push(a.frame.clone());
            return;
        }
        let request_id = conn.request_id;
        let reply = move |kind| CmFrame { dst_mac: mac, dst_ep: ep, kind, dst_vi: vi, src_vi: 0, generation: 0, imm: 0, ack: None, conn: ConnRepr { request_id, ..ConnRepr::default() } };
        if self.incoming.iter().any(|c| key(c) == k) {
            self.out.push(reply(Kind::ConnPending));
            return;
        }
        match self.waits.iter().position(|w| w.matched.is_none() && w.discriminator == conn.discriminator) {
            Some(w) => {
                let id = self.fresh_id();
                self.incoming.push(Incoming { id, mac, ep, vi, attrs: conn });
                self.waits[w].matched = Some(id);
                self.out.push(reply(Kind::ConnPending));
            }
            None => self.out.push(reply(Kind::ConnNoMatch)),
        }
    }

    /// Nothing timed: [`Self::on_timer`] would do nothing.
    pub fn timers_idle(&self) -> bool {
        self.requests.is_empty()
    }

    /// Retransmits requests that are due and settles those whose time is up.
    #[inline]
    pub fn on_timer(&mut self, now: Instant) {
        if !self.timers_idle() {
            self.on_timer_requests(now);
        }
    }

    fn on_timer_requests(&mut self, now: Instant) {
        let out = &mut self.out;
        let no_match_grace = |r: &mut Request| {
            if let Some(t) = r.no_match_since.filter(|_| !r.until_matched) {
                if !r.pending && now >= t + NO_MATCH_GRACE {
                    r.state = RequestState::NoMatch;
                }
            }
        };
        self.requests.on_timer(now, no_match_grace, |r, due| match due {
            // Heard only NO_MATCH until the end: say so.
            Due::Expired => r.state = if r.until_matched && r.no_match_since.is_some() && !r.pending { RequestState::NoMatch } else { RequestState::TimedOut },
            Due::Send => out.push(CmFrame { dst_mac: r.mac, dst_ep: ANY_ENDPOINT, kind: Kind::ConnRequest, dst_vi: 0, src_vi: r.vi, generation: 0, imm: 0, ack: None, conn: r.attrs.clone() }),
        });
    }

    /// The next instant [`ConnectionManager::on_timer`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.requests.next_deadline(|r| r.no_match_since.map(|t| t + NO_MATCH_GRACE))
    }

    pub fn local(&self) -> (MacAddr, u32) {
        (self.mac, self.ep)
    }

    fn fresh_id(&mut self) -> u32 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PeerConnector;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn attrs(d: &[u8]) -> ConnRepr {
        ConnRepr { reliability: 2, max_transfer_size: 1 << 20, mtu: 1500, discriminator: d.to_vec(), ..Default::default() }
    }

    /// Delivers every queued frame of `from` to `to`.
    fn pump(from: &mut ConnectionManager, from_mac: MacAddr, to: &mut ConnectionManager, now: Instant) -> usize {
        let frames: Vec<_> = from.outgoing().drain(..).collect();
        let n = frames.len();
        for f in frames {
            let h = CmHeader { kind: f.kind, src_mac: from_mac, src_ep: from.ep, src_vi: f.src_vi, dst_vi: f.dst_vi, generation: f.generation, imm: f.imm };
            to.on_frame(h, f.conn, now).expect("from the host asked");
        }
        n
    }

    #[test]
    fn accept_flow() {
        let t0 = Instant::now();
        let mut server = ConnectionManager::new(A, 10);
        let mut client = ConnectionManager::new(B, 20);
        let w = server.wait_begin(b"svc");
        client.request_begin(3, A, attrs(b"svc"), t0, t0 + Duration::from_secs(1));
        assert_eq!(pump(&mut client, B, &mut server, t0), 1);
        let inc = server.wait_take(w).unwrap().clone();
        assert_eq!((inc.mac, inc.ep, inc.vi), (B, 20, 3));
        pump(&mut server, A, &mut client, t0); // pending
        assert_eq!(client.request_poll(3, t0), RequestState::InProgress);
        let peer = server.accept(inc.id, 7, &attrs(b"")).unwrap();
        assert_eq!((peer.mac, peer.ep, peer.vi), (B, 20, 3));
        // the accept is lost; the client retransmits and gets it again
        server.outgoing().clear();
        let t1 = t0 + REQUEST_RTO;
        client.on_timer(t1);
        assert_eq!(pump(&mut client, B, &mut server, t1), 1);
        pump(&mut server, A, &mut client, t1);
        match client.request_poll(3, t1) {
            RequestState::Accepted(p) => {
                assert_eq!((p.mac, p.ep, p.vi, p.generation), (A, 10, 7, peer.generation));
            }
            s => panic!("{s:?}"),
        }
    }

    /// Answers naming the request from another host, or from no
    /// endpoint, are foreign and change nothing: the client still
    /// connects to the server it asked.
    #[test]
    fn answers_from_another_host_are_foreign() {
        const M: MacAddr = MacAddr([2, 0, 0, 0, 0, 9]);
        let t0 = Instant::now();
        let mut server = ConnectionManager::new(A, 10);
        let mut client = ConnectionManager::new(B, 20);
        let w = server.wait_begin(b"svc");
        client.request_begin(3, A, attrs(b"svc"), t0, t0 + Duration::from_secs(1));
        let id = client.requests.find_mut(|_| true).unwrap().attrs.request_id;
        let named = ConnRepr { request_id: id, ..ConnRepr::default() };
        for (kind, mac, ep) in [(Kind::ConnAccept, M, 10), (Kind::ConnReject, M, 10), (Kind::ConnNoMatch, M, 10), (Kind::ConnPending, M, 10), (Kind::ConnAccept, A, ANY_ENDPOINT)] {
            let h = CmHeader { kind, src_mac: mac, src_ep: ep, src_vi: 9, dst_vi: 3, generation: 77, imm: 0 };
            assert_eq!(client.on_frame(h, named.clone(), t0), Err(Foreign), "{kind:?} from {mac}/{ep}");
        }
        assert_eq!(client.request_poll(3, t0 + NO_MATCH_GRACE), RequestState::InProgress);
        pump(&mut client, B, &mut server, t0);
        let inc = server.wait_take(w).unwrap().clone();
        let peer = server.accept(inc.id, 7, &attrs(b"")).unwrap();
        pump(&mut server, A, &mut client, t0);
        match client.request_poll(3, t0) {
            RequestState::Accepted(p) => assert_eq!((p.mac, p.ep, p.vi, p.generation), (A, 10, 7, peer.generation)),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn no_match_reject_timeout() {
        let t0 = Instant::now();
        let mut server = ConnectionManager::new(A, 10);
        let mut client = ConnectionManager::new(B, 20);
        client.request_begin(1, A, attrs(b"nobody"), t0, t0 + Duration::from_secs(1));
        pump(&mut client, B, &mut server, t0);
        pump(&mut server, A, &mut client, t0);
        assert_eq!(client.request_poll(1, t0), RequestState::InProgress);
        assert_eq!(client.request_poll(1, t0 + NO_MATCH_GRACE), RequestState::NoMatch);

        let w = server.wait_begin(b"svc");
        client.request_begin(2, A, attrs(b"svc"), t0, t0 + Duration::from_secs(1));
        pump(&mut client, B, &mut server, t0);
        let id = server.wait_take(w).unwrap().id;
        assert!(server.reject(id, RejectReason::Refused));
        pump(&mut server, A, &mut client, t0);
        assert_eq!(client.request_poll(2, t0), RequestState::Rejected(RejectReason::Refused));

        client.request_begin(4, A, attrs(b"svc"), t0, t0 + Duration::from_millis(50));
        client.outgoing().clear();
        assert_eq!(client.request_poll(4, t0 + Duration::from_millis(50)), RequestState::TimedOut);
    }

    /// A request kept until matched outlasts NO_MATCH: the server starts
    /// waiting later, and the same request (one id) is matched and
    /// accepted; with nobody waiting to the end, it ends NO_MATCH.
    #[test]
    fn request_until_matched_outlasts_no_match() {
        let t0 = Instant::now();
        let mut server = ConnectionManager::new(A, 10);
        let mut client = ConnectionManager::new(B, 20);
        client.request_begin(5, A, attrs(b"svc"), t0, t0 + Duration::from_secs(1));
        client.request_until_matched(5);
        let id = client.requests.find_mut(|_| true).unwrap().attrs.request_id;
        let mut t = t0;
        for _ in 0..5 {
            pump(&mut client, B, &mut server, t);
            pump(&mut server, A, &mut client, t); // NO_MATCH
            t += NO_MATCH_GRACE;
            assert_eq!(client.request_poll(5, t), RequestState::InProgress, "NO_MATCH does not end it");
        }
        let w = server.wait_begin(b"svc");
        assert_eq!(pump(&mut client, B, &mut server, t), 1, "repeated within the grace");
        let inc = server.wait_take(w).unwrap().clone();
        assert_eq!(inc.attrs.request_id, id, "the same request");
        server.accept(inc.id, 7, &attrs(b"")).unwrap();
        pump(&mut server, A, &mut client, t);
        assert!(matches!(client.request_poll(5, t), RequestState::Accepted(_)));

        client.request_begin(6, A, attrs(b"nobody"), t, t + Duration::from_millis(100));
        client.request_until_matched(6);
        pump(&mut client, B, &mut server, t);
        pump(&mut server, A, &mut client, t);
        assert_eq!(client.request_poll(6, t + Duration::from_millis(100)), RequestState::NoMatch);
    }

    /// One opened NIC's two connection managers, as the engine holds them.
    struct Nic {
        mac: MacAddr,
        ep: u32,
        cm: ConnectionManager,
        peers: PeerConnector,
    }

    impl Nic {
        fn new(mac: MacAddr, ep: u32) -> Nic {
            Nic { mac, ep, cm: ConnectionManager::new(mac, ep), peers: PeerConnector::new(mac, ep) }
        }

        /// Everything both managers queued.
        fn drain(&mut self) -> Vec<CmFrame> {
            let mut frames: Vec<_> = self.cm.outgoing().drain(..).collect();
            frames.append(self.peers.outgoing());
            frames
        }
    }

    /// Delivers `from`'s queued frames to `to` through the wire format,
    /// dispatching by kind as the engine's receive path does (a
    /// `ConnReject` goes to both managers); returns the kinds delivered.
    fn exchange(from: &mut Nic, to: &mut Nic, now: Instant) -> Vec<Kind> {
        let (mac, ep) = (from.mac, from.ep);
        let mut kinds = Vec::new();
        for f in from.drain() {
            let mut buf = [0u8; 160];
            let n = f.conn.emit(&mut buf);
            let c = ConnRepr::parse(&buf[..n]).unwrap();
            match f.kind {
                Kind::PeerRequest => to.peers.on_request(mac, ep, f.src_vi, c),
                Kind::PeerAccept => to.peers.on_answer(f.kind, mac, ep, f.src_vi, f.generation, f.imm, c).expect("from the peer asked"),
                kind => {
                    if kind == Kind::ConnReject {
                        to.peers.on_answer(kind, mac, ep, f.src_vi, f.generation, f.imm, c.clone()).expect("from the peer asked");
                    }
                    let h = CmHeader { kind, src_mac: mac, src_ep: ep, src_vi: f.src_vi, dst_vi: f.dst_vi, generation: f.generation, imm: f.imm };
                    to.cm.on_frame(h, c, now).expect("from the host asked");
                }
            }
            kinds.push(f.kind);
        }
        kinds
    }

    /// Peer attributes: our discriminator `mine`, the one sought `theirs`.
    fn peer_attrs(mine: &[u8], theirs: &[u8]) -> ConnRepr {
        ConnRepr { peer_discriminator: theirs.to_vec(), ..attrs(mine) }
    }

    #[test]
    fn a_peer_request_does_not_match_a_connect_wait() {
        let t0 = Instant::now();
        let dl = t0 + Duration::from_millis(50);
        let (mut a, mut b) = (Nic::new(A, 10), Nic::new(B, 20));
        let w = b.cm.wait_begin(b"svc");
        // Both discriminators equal the wait's: neither may be taken for it.
        a.peers.begin(3, B, peer_attrs(b"svc", b"svc"), t0, dl);
        assert_eq!(exchange(&mut a, &mut b, t0), [Kind::PeerRequest]);
        assert!(b.cm.wait_take(w).is_none());
        assert!(b.drain().is_empty(), "a peer request gets no client/server answer");
        // Alone, the requester retransmits on the request schedule and
        // times out at its deadline.
        let t1 = t0 + REQUEST_RTO;
        assert_eq!(a.peers.next_deadline(), Some(t1));
        assert_eq!(a.peers.poll(3, t1), RequestState::InProgress);
        assert_eq!(exchange(&mut a, &mut b, t1), [Kind::PeerRequest]);
        assert!(b.cm.wait_take(w).is_none());
        assert_eq!(a.peers.poll(3, dl), RequestState::TimedOut);
    }

    #[test]
    fn a_connect_request_does_not_match_a_peer_request() {
        let t0 = Instant::now();
        let dl = t0 + Duration::from_secs(1);
        let (mut a, mut b) = (Nic::new(A, 10), Nic::new(B, 20));
        // B seeks a peer at A called "svc", under its own name "svc".
        b.peers.begin(5, A, peer_attrs(b"svc", b"svc"), t0, dl);
        assert_eq!(exchange(&mut b, &mut a, t0), [Kind::PeerRequest]);
        assert!(a.drain().is_empty(), "no peer request at A: ignored");
        // A client at A asks B's "svc": B has no ConnectWait, only the
        // peer request, so the answer is NO_MATCH and B keeps waiting.
        a.cm.request_begin(3, B, attrs(b"svc"), t0, dl);
        assert_eq!(exchange(&mut a, &mut b, t0), [Kind::ConnRequest]);
        assert_eq!(exchange(&mut b, &mut a, t0), [Kind::ConnNoMatch]);
        assert_eq!(a.cm.request_poll(3, t0 + NO_MATCH_GRACE), RequestState::NoMatch);
        assert_eq!(b.peers.poll(5, t0 + NO_MATCH_GRACE), RequestState::InProgress);
    }
}
