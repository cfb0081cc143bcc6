//! The engine side of the connection calls: ConnectWait / Accept / Reject
//! on the server, ConnectRequest on the client, Disconnect on either. The
//! waiting itself is done by the API layer around these non-blocking steps.

use super::Core;
use crate::error::{Result, ViaError, VipReturn};
use crate::vi::{Reliability, ViAttributes, ViPhase};
use std::time::Instant;
use via_kernel_agent::conn::{RejectReason, RequestState};
use via_kernel_agent::peer::compatible;
use via_kernel_agent::wire::{ConnRepr, MAX_DISCRIMINATOR};
use via_kernel_agent::MacAddr;

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
        }
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
        let repr = self.conn_repr(&attrs, &[]);
        let peer = self.cm.accept(conn, id, &repr).expect("request checked above");
        let rto = self.config.rto_initial;
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
        let repr = self.conn_repr(&vi.attrs, discriminator);
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
        let st = self.cm.request_poll(id, Instant::now());
        self.settle_request(id, st, "the server")
    }

    /// Applies the outcome of a connection request (either model) to VI
    /// `id`: connected, or back to Idle with the error. `None` while pending.
    fn settle_request(&mut self, id: u16, st: RequestState, who: &str) -> Option<Result<()>> {
        let rto = self.config.rto_initial;
        let vi = self.vi_mut(id).ok()?;
        let out = match st {
            RequestState::InProgress => return None,
            RequestState::Accepted(peer) => {
                vi.reset_protocol(rto);
                vi.peer = Some(peer);
                vi.phase = ViPhase::Connected;
                return Some(Ok(()));
            }
            RequestState::Rejected(r) => match r {
                RejectReason::Refused => ViaError::new(VipReturn::Reject, format!("{who} rejected the connection")),
                RejectReason::ReliabilityLevel => ViaError::new(VipReturn::InvalidReliabilityLevel, format!("{who}'s VI has another reliability level")),
                RejectReason::Mtu => ViaError::new(VipReturn::InvalidMtu, format!("{who}'s VI has another MaxTransferSize")),
                RejectReason::RdmaRead => ViaError::new(VipReturn::InvalidRdmaRead, format!("{who}'s VI differs in RDMA read enable")),
            },
            RequestState::NoMatch => ViaError::new(VipReturn::NoMatch, "no ConnectWait is pending for that address (retry)"),
            RequestState::TimedOut => ViaError::timeout(format!("no answer from {who} to the connection request")),
        };
        vi.phase = ViPhase::Idle;
        Some(Err(out))
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
        self.vi_mut(id)?.phase = ViPhase::ConnectPending;
        self.peers.begin(id, mac, repr, Instant::now(), deadline);
        Ok(())
    }

    /// `VipConnectPeerDone`: where the peer request of VI `id` stands
    /// (`None` while pending).
    pub fn peer_request_poll(&mut self, id: u16) -> Option<Result<()>> {
        if self.vi(id).ok()?.phase == ViPhase::Connected {
            return Some(Ok(())); // settled by an earlier poll
        }
        let st = self.peers.poll(id, Instant::now());
        self.settle_request(id, st, "the peer")
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
                self.queue_disconnect(id, &peer);
            }
            ViPhase::ConnectPending => {
                self.cm.request_cancel(id);
                self.peers.cancel(id);
            }
            ViPhase::Idle | ViPhase::Error => {}
        }
        self.flush_vi(id);
        self.cm.forget_vi(id);
        let rto = self.config.rto_initial;
        let vi = self.vi_mut(id)?;
        vi.phase = ViPhase::Idle;
        vi.peer = None;
        vi.reset_protocol(rto);
        self.acks_due.retain(|v| *v != id);
        Ok(())
    }
}
