//! The engine side of the connection calls: ConnectWait / Accept / Reject
//! on the server, ConnectRequest on the client, Disconnect on either. The
//! waiting itself is done by the API layer around these non-blocking steps.

use super::Core;
use crate::error::{Result, ViaError, VipReturn};
use crate::vi::{Reliability, ViAttributes, ViPhase};
use std::time::Instant;
use via_kernel_agent::auth::{ConnEnd, Nonce};
use via_kernel_agent::conn::{CmFrame, Peer, RejectReason, RequestState};
use via_kernel_agent::peer::compatible;
use via_wire::{ConnRepr, Frame, Kind, MAX_DISCRIMINATOR};
use via_wire::MacAddr;

/// A connection request handed to a server by `ConnectWait`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncomingRequest {
    /// The connection handle to accept or reject.
    pub conn: u32,
    pub remote_mac: MacAddr,
    /// The client VI's attributes (its protection tag is meaningless here).
    pub reliability: Option<Reliability>,
    pub max_transfer_size: u32,
    pub enable_rdma_write: bool,
    pub enable_rdma_read: bool,
}

impl Core {
    fn conn_repr(&self, a: &ViAttributes, discriminator: &[u8]) -> ConnRepr {
        ConnRepr {
            reliability: a.reliability.bits(),
            enable_rdma_write: a.enable_rdma_write,
            enable_rdma_read: a.enable_rdma_read,
            max_transfer_size: a.max_transfer_size,
            mtu: self.mtu as u32,
            request_id: 0,
            discriminator: discriminator.to_vec(),
            peer_discriminator: Vec::new(),
            nonce: None,
        }
    }

    /// With a cluster secret: a fresh nonce for VI `id`'s request to
    /// `asked` (or its accept), kept until the request settles.
    fn nonce_for(&mut self, id: u16, asked: Option<MacAddr>) -> Option<Nonce> {
        self.auth.as_mut().map(|k| k.new_nonce(id, asked))
    }

    /// With a cluster secret: derives and installs the keys of VI `id`'s
    /// connection to `peer`, our nonce being `ours`. Fails when either
    /// nonce is missing (the other side has no secret).
    fn install_keys(&mut self, id: u16, ours: Option<Nonce>, peer: &Peer) -> Result<()> {
        let ep = self.ep;
        let Some(k) = self.auth.as_mut() else { return Ok(()) };
        let (Some(mine), Some(theirs)) = (ours, peer.attrs.nonce) else {
            return Err(ViaError::new(VipReturn::Reject, "the other side sent no key nonce: it has no cluster secret (VIA_SECRET) while this host has one"));
        };
        let keys = k.secret.connection_keys(&ConnEnd { ep, vi: id, nonce: mine }, &ConnEnd { ep: peer.ep, vi: peer.vi, nonce: theirs }, peer.generation);
        k.set_vi(id, keys);
        Ok(())
    }

    pub fn connect_wait_begin(&mut self, discriminator: &[u8]) -> Result<u32> {
        if discriminator.len() > MAX_DISCRIMINATOR {
            return Err(ViaError::invalid(format!("discriminator of {} bytes (at most {MAX_DISCRIMINATOR})", discriminator.len())));
        }
        Ok(self.cm.wait_begin(discriminator))
    }

    pub fn connect_wait_poll(&mut self, wait: u32) -> Option<IncomingRequest> {
        let inc = self.cm.wait_take(wait)?;
        Some(IncomingRequest {
            conn: inc.id,
            remote_mac: inc.mac,
            reliability: Reliability::from_bits(inc.attrs.reliability),
            max_transfer_size: inc.attrs.max_transfer_size,
            enable_rdma_write: inc.attrs.enable_rdma_write,
            enable_rdma_read: inc.attrs.enable_rdma_read,
        })
    }

    pub fn connect_wait_end(&mut self, wait: u32) {
        self.cm.wait_end(wait);
    }

    /// `VipConnectAccept`: connects VI `id` to the requester of `conn`.
    pub fn accept(&mut self, conn: u32, id: u16) -> Result<()> {
        let vi = self.vi(id)?;
        if vi.phase != ViPhase::Idle {
            return Err(ViaError::state(format!("VI is {:?}, not Idle", vi.phase)));
        }
        let attrs = vi.attrs;
        let inc = self.cm.incoming(conn).ok_or_else(|| ViaError::invalid(format!("no pending connection request {conn}")))?;
        let remote = inc.attrs.clone();
        if let Err(reason) = compatible(&self.conn_repr(&attrs, &[]), &remote) {
            self.cm.reject(conn, reason);
            let (code, what) = match reason {
                RejectReason::ReliabilityLevel => (VipReturn::InvalidReliabilityLevel, "reliability levels differ"),
                RejectReason::Mtu => (VipReturn::InvalidMtu, "MaxTransferSize differs"),
                _ => (VipReturn::InvalidRdmaRead, "RDMA read enable differs"),
            };
            return Err(ViaError::new(code, format!("connection attributes: {what} (the request was rejected)")));
        }
        if self.auth.is_some() && remote.nonce.is_none() {
            self.cm.reject(conn, RejectReason::Authentication);
            return Err(ViaError::new(VipReturn::Reject, "the client sent no key nonce: it has no cluster secret (VIA_SECRET) while this host has one (the request was rejected)"));
        }
        let mut repr = self.conn_repr(&attrs, &[]);
        repr.nonce = self.nonce_for(id, None);
        let peer = self.cm.accept(conn, id, &repr).expect("request checked above");
        let ours = self.auth.as_mut().and_then(|k| k.take_nonce(id)).map(|(n, _)| n);
        self.install_keys(id, ours, &peer)?;
        let rto = (self.config.rto_initial, self.config.rto_max);
        let vi = self.vi_mut(id)?;
        vi.reset_protocol(rto);
        vi.peer = Some(peer);
        vi.phase = ViPhase::Connected;
        Ok(())
    }

    /// `VipConnectReject`.
    pub fn reject(&mut self, conn: u32) -> Result<()> {
        if self.cm.reject(conn, RejectReason::Refused) {
            Ok(())
        } else {
            Err(ViaError::invalid(format!("no pending connection request {conn}")))
        }
    }

    /// Starts `VipConnectRequest` from VI `id` to `mac`/`discriminator`.
    pub fn connect_request_begin(&mut self, id: u16, mac: MacAddr, discriminator: &[u8], deadline: Instant) -> Result<()> {
        if discriminator.len() > MAX_DISCRIMINATOR {
            return Err(ViaError::invalid(format!("discriminator of {} bytes (at most {MAX_DISCRIMINATOR})", discriminator.len())));
        }
        let vi = self.vi(id)?;
        if vi.phase != ViPhase::Idle {
            return Err(ViaError::state(format!("VI is {:?}, not Idle", vi.phase)));
        }
        let mut repr = self.conn_repr(&vi.attrs, discriminator);
        repr.nonce = self.nonce_for(id, Some(mac));
        self.vi_mut(id)?.phase = ViPhase::ConnectPending;
        self.cm.request_begin(id, mac, repr, Instant::now(), deadline);
        Ok(())
    }

    /// Makes the request of VI `id` outlast NO_MATCH answers (see
    /// [`ConnectionManager::request_until_matched`]).
    pub fn connect_request_until_matched(&mut self, id: u16) {
        self.cm.request_until_matched(id);
    }

    /// Where `VipConnectRequest` of VI `id` stands: `None` while pending.
    pub fn connect_request_poll(&mut self, id: u16) -> Option<Result<()>> {
        if self.vi(id).ok()?.phase == ViPhase::Connected {
            return Some(Ok(())); // settled by the server's first frame (`settle_answered_by`)
        }
        let st = self.cm.request_poll(id, Instant::now());
        self.settle_request(id, st, "the server")
    }

    /// Applies the outcome of a connection request (either model) to VI
    /// `id`: connected, or back to Idle with the error. `None` while pending.
    fn settle_request(&mut self, id: u16, st: RequestState, who: &str) -> Option<Result<()>> {
        let rto = (self.config.rto_initial, self.config.rto_max);
        self.vi(id).ok()?;
        let (ours, asked) = match st {
            RequestState::InProgress => return None,
            _ => self.auth.as_mut().and_then(|k| k.take_nonce(id)).map_or((None, None), |(n, m)| (Some(n), m)),
        };
        let keys = match &st {
            RequestState::Accepted(peer) => self.install_keys(id, ours, peer),
            _ => Ok(()),
        };
        let unauthenticated = asked.is_some_and(|m| self.auth.as_ref().is_some_and(|k| k.sent_unauthenticated(m)));
        let vi = self.vi_mut(id).ok()?;
        let out = match st {
            RequestState::InProgress => return None,
            RequestState::Accepted(_) if keys.is_err() => keys.unwrap_err(),
            RequestState::Accepted(peer) => {
                vi.reset_protocol(rto);
                vi.peer = Some(peer);
                vi.phase = ViPhase::Connected;
                // Its answer came: it is connected (`engine::boxed`).
                vi.tx.peer_heard = true;
                return Some(Ok(()));
            }
            RequestState::Rejected(r) => match r {
                RejectReason::Refused => ViaError::new(VipReturn::Reject, format!("{who} rejected the connection")),
                RejectReason::ReliabilityLevel => ViaError::new(VipReturn::InvalidReliabilityLevel, format!("{who}'s VI has another reliability level")),
                RejectReason::Mtu => ViaError::new(VipReturn::InvalidMtu, format!("{who}'s VI has another MaxTransferSize")),
                RejectReason::RdmaRead => ViaError::new(VipReturn::InvalidRdmaRead, format!("{who}'s VI differs in RDMA read enable")),
                RejectReason::Authentication => ViaError::new(VipReturn::Reject, format!("{who} refused the connection: one host has a cluster secret (VIA_SECRET) and the other has none or another")),
            },
            RequestState::NoMatch => ViaError::new(VipReturn::NoMatch, "no ConnectWait is pending for that address (retry)"),
            RequestState::TimedOut if unauthenticated => ViaError::timeout(format!("no authenticated answer from {who} to the connection request: it answered without a valid tag, so it has no cluster secret or another one (VIA_SECRET must name the same secret on both hosts)")),
            RequestState::TimedOut => ViaError::timeout(format!("no answer from {who} to the connection request")),
        };
        vi.phase = ViPhase::Idle;
        Some(Err(out))
    }

    /// Is some connection request of ours (either model) still to be
    /// polled? Only then can a frame settle one
    /// ([`Core::settle_answered_by`]).
    #[inline]
    pub(super) fn requests_out(&self) -> bool {
        !(self.peers.timers_idle() && self.cm.timers_idle())
    }

    /// The frame `f` is for a VI whose connection request was accepted by
    /// `f`'s very sender (its MAC, endpoint, VI and generation), an answer
    /// the VI's program has not polled yet: settles the request now, as
    /// that poll would, so that the frame is taken rather than refused
    /// (as stale, or for want of the connection's keys) and sent again
    /// after a timeout. For the side that decided a peer connection, the
    /// frame says that its accept arrived. The program's next poll then
    /// finds the VI connected. A request whose keys cannot be made (the
    /// peer sent no nonce) is left to that poll, which says why.
    pub(super) fn settle_answered_by<T: AsRef<[u8]>>(&mut self, f: &Frame<T>) {
        let id = f.dst_vi();
        if self.vi(id).map_or(true, |v| v.phase != ViPhase::ConnectPending) {
            return;
        }
        let keyed = self.auth.is_some();
        let by_sender = |p: &Peer| p.mac == f.src_mac() && p.ep == f.src_ep() && p.vi == f.src_vi() && p.generation == f.generation() && (!keyed || p.attrs.nonce.is_some());
        let now = Instant::now();
        let (st, who) = if self.peers.accepted(id).is_some_and(by_sender) {
            (self.peers.poll(id, now), "the peer")
        } else if self.cm.accepted(id).is_some_and(by_sender) {
            (self.cm.request_poll(id, now), "the server")
        } else {
            return;
        };
        self.counters.requests_settled_by_frame += 1;
        let _ = self.settle_request(id, st, who);
    }

    /// Starts `VipConnectPeerRequest` from VI `id`: our discriminator
    /// `local`, the peer's `remote` at `mac`.
    pub fn peer_request_begin(&mut self, id: u16, mac: MacAddr, local: &[u8], remote: &[u8], deadline: Instant) -> Result<()> {
        for d in [local, remote] {
            if d.is_empty() || d.len() > MAX_DISCRIMINATOR {
                return Err(ViaError::invalid(format!("a peer discriminator has 1 to {MAX_DISCRIMINATOR} bytes, not {}", d.len())));
            }
        }
        let vi = self.vi(id)?;
        if vi.phase != ViPhase::Idle {
            return Err(ViaError::state(format!("VI is {:?}, not Idle", vi.phase)));
        }
        let mut repr = self.conn_repr(&vi.attrs, local);
        repr.peer_discriminator = remote.to_vec();
        repr.nonce = self.nonce_for(id, Some(mac));
        self.vi_mut(id)?.phase = ViPhase::ConnectPending;
        self.peers.begin(id, mac, repr, Instant::now(), deadline);
        Ok(())
    }

    /// `VipConnectPeerDone`: where the peer request of VI `id` stands
    /// (`None` while pending).
    pub fn peer_request_poll(&mut self, id: u16) -> Option<Result<()>> {
        if self.vi(id).ok()?.phase == ViPhase::Connected {
            return Some(Ok(())); // settled by an earlier poll, or by the peer's first frame
        }
        let now = Instant::now();
        // The deciding side is connected once its accept has left: the
        // other side connects only when the accept arrives, and a program
        // that goes on to block elsewhere (not driving the engine) would
        // leave it queued for good (a next hop still being resolved). Up
        // to the request's deadline.
        if self.answer_queued(id, Kind::PeerAccept) && !self.peers.expired(id, now) {
            return None;
        }
        let st = self.peers.poll(id, now);
        self.settle_request(id, st, "the peer")
    }

    /// Is VI `id`'s answer `kind` (a connection or peer accept) still
    /// queued, not yet taken by the device?
    pub fn answer_queued(&mut self, id: u16, kind: Kind) -> bool {
        let ours = |f: &CmFrame| f.kind == kind && f.src_vi == id;
        self.cm.outgoing().iter().any(ours) || self.peers.outgoing().iter().any(ours)
    }

    /// Abandons a pending request (the waiting call gave up).
    pub fn connect_request_cancel(&mut self, id: u16) {
        self.cm.request_cancel(id);
        if let Ok(vi) = self.vi_mut(id) {
            if vi.phase == ViPhase::ConnectPending {
                vi.phase = ViPhase::Idle;
            }
        }
    }

    /// `VipDisconnect`: tells the peer, flushes everything posted, and
    /// returns the VI to Idle.
    pub fn disconnect(&mut self, id: u16) -> Result<()> {
        let vi = self.vi(id)?;
        match vi.phase {
            ViPhase::Connected => {
                let peer = vi.peer.clone().expect("connected VI has a peer");
                let (cx, vi) = self.split(id).expect("looked up above");
                cx.queue_disconnect(vi, &peer);
            }
            ViPhase::ConnectPending => {
                self.cm.request_cancel(id);
                self.peers.cancel(id);
            }
            ViPhase::Idle | ViPhase::Error => {}
        }
        self.flush_vi(id);
        self.cm.forget_vi(id);
        if let Some(k) = self.auth.as_mut() {
            k.clear_vi(id);
            k.take_nonce(id);
        }
        let rto = (self.config.rto_initial, self.config.rto_max);
        let vi = self.vi_mut(id)?;
        vi.phase = ViPhase::Idle;
        vi.peer = None;
        vi.reset_protocol(rto);
        self.outbox.forget_vi(id);
        Ok(())
    }
}
