//! The id-level API, [`RawNic`]: VIs and CQs named by their numbers,
//! descriptors by their addresses in memory the caller registered. This is
//! what the C ABI (`vipl`) is built on, and the one path every operation
//! takes: the Rust API's [`crate::Vi`], [`crate::Cq`] and
//! [`crate::MemoryRegion`] are owners wrapped around these calls.
//!
//! Nothing here can make the engine touch memory that is not registered:
//! every address is checked against the registration table when used. The
//! one promise the caller makes is in [`RawNic::register`].

use crate::engine::post::Queue;
use crate::error::{Result, ViaError, VipReturn};
use crate::nic::Nic;
use crate::vi::{ViAttributes, ViPhase};
use std::time::{Duration, Instant};
use via_kernel_agent::memory::{MemAttributes, Ptag};
use via_wire::MacAddr;

/// How long `VipConnectAccept` waits for its accept to leave: the
/// kernel's neighbour resolution gives up after three one-second probes.
const ANSWER_WAIT: Duration = Duration::from_secs(3);
/// A long time standing for "no limit".
const FOREVER: Duration = Duration::from_secs(3600 * 24 * 365);

/// One look of a wait at the VI or CQ it waits on (`now`: its serial
/// and answer, or why it is not there): the first look notes which object
/// it is; later ones end the wait with INVALID_STATE when it was destroyed
/// meanwhile (and its number perhaps given to a new one), saying `gone`.
fn still_the_same<T>(began_on: &mut Option<u64>, now: Result<(u64, Option<T>)>, gone: &'static str) -> Result<Option<T>> {
    match (now, *began_on) {
        (Ok((s, answer)), None) => {
            *began_on = Some(s);
            Ok(answer)
        }
        (Ok((s, answer)), Some(b)) if s == b => Ok(answer),
        (Err(e), None) => Err(e),
        _ => Err(ViaError::state(gone)),
    }
}

/// A NIC addressed by numbers: the id-level calls. Get one with
/// [`Nic::raw`]; it is the same NIC (a view, no second handle).
#[repr(transparent)]
pub struct RawNic(Nic);

impl Nic {
    /// This NIC's id-level calls.
    pub fn raw(&self) -> &RawNic {
        // SAFETY: `RawNic` is `repr(transparent)` over `Nic`, so the two
        // have one layout and a `&Nic` is a valid `&RawNic` for as long.
        unsafe { &*(self as *const Nic as *const RawNic) }
    }
}

impl RawNic {
    /// The NIC these calls address.
    pub fn nic(&self) -> &Nic {
        &self.0
    }

    /// `VipRegisterMem` of memory the caller owns.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid, readable and writable memory
    /// until it is deregistered (the VIA contract): the engine reads and
    /// writes it, checked against the registration, whenever descriptors
    /// or the peer's RDMA name it.
    pub unsafe fn register(&self, addr: usize, len: usize, attrs: MemAttributes) -> Result<u32> {
        if addr == 0 {
            return Err(ViaError::invalid("cannot register memory at address 0"));
        }
        self.0.lock().register_memory(addr, len, attrs)
    }

    /// `VipDeregisterMem`.
    pub fn deregister(&self, addr: usize, handle: u32) -> Result<()> {
        self.0.lock().deregister_memory(addr, handle)
    }

    /// `VipQueryMem`: the attributes of the region `handle` starting at `addr`.
    pub fn query_mem(&self, addr: usize, handle: u32) -> Result<MemAttributes> {
        let e = self.0.lock();
        let r = e.core.mem.lookup(handle)?;
        if r.addr != addr {
            return Err(ViaError::invalid(format!("address {addr:#x} is not where memory handle {handle:#x} starts")));
        }
        Ok(r.attrs)
    }

    /// `VipSetMemAttributes`.
    pub fn set_mem_attributes(&self, addr: usize, handle: u32, attrs: MemAttributes) -> Result<()> {
        self.0.lock().core.mem.set_attributes(addr, handle, attrs).map_err(|e| match e {
            via_kernel_agent::memory::MemError::BadPtag => ViaError::new(VipReturn::InvalidPtag, "unknown protection tag"),
            e => e.into(),
        })
    }

    /// `VipCreateVi`: returns the VI's number.
    pub fn vi_create(&self, attrs: &ViAttributes, send_cq: Option<u16>, recv_cq: Option<u16>) -> Result<u16> {
        self.0.lock().core.create_vi(*attrs, send_cq, recv_cq)
    }

    /// `VipDestroyVi`: INVALID_STATE while connected or with descriptors
    /// posted and not handed back.
    pub fn vi_destroy(&self, id: u16) -> Result<()> {
        let r = self.0.with(|e| {
            let v = e.core.vi(id)?;
            if matches!(v.phase, ViPhase::Connected | ViPhase::ConnectPending) {
                return Err(ViaError::state(format!("the VI is {:?}: disconnect it first", v.phase)));
            }
            let n = v.sq.len() + v.rq.len();
            if n > 0 {
                return Err(ViaError::state(format!("{n} descriptors are still posted on the VI (collect them with Done first)")));
            }
            e.core.destroy_vi(id)
        });
        self.0.shared.notifier.disarm(&[crate::NotifyTarget::Send(id), crate::NotifyTarget::Recv(id)]);
        r
    }

    /// Destroys VI `id` whatever its state: a connected VI is torn down
    /// (the peer learns of it from the connection's end), what is posted
    /// is forgotten. What dropping a [`crate::Vi`] does.
    pub(crate) fn vi_tear_down(&self, id: u16) {
        self.0.shared.notifier.disarm(&[crate::NotifyTarget::Send(id), crate::NotifyTarget::Recv(id)]);
        let _ = self.0.with(|e| e.core.destroy_vi(id));
        self.0.progress();
    }

    /// `VipQueryVi`: state, attributes, send queue empty, receive queue empty.
    pub fn vi_query(&self, id: u16) -> Result<(ViPhase, ViAttributes, bool, bool)> {
        let e = self.0.lock();
        let v = e.core.vi(id)?;
        Ok((v.phase, v.attrs, v.sq.is_empty(), v.rq.is_empty()))
    }

    /// VI `id`'s sequenced streams in words, for diagnostics (what a
    /// stalled connection waits on): the sender's position, oldest
    /// unacknowledged and highest PSN sent, receiver-not-ready back-off,
    /// the retransmission timer and its timeouts since the peer's last progress;
    /// the receiver's expected PSN, frames held past a gap, whether a
    /// message is being reassembled; both queues' cursors.
    pub fn vi_transport_state(&self, id: u16) -> Result<String> {
        let mut e = self.0.lock();
        let now = e.core.clock.now();
        let v = e.core.vi(id)?;
        let (t, r) = (&v.tx, &v.rx);
        let when = |at: Option<crate::clock::Time>| match at {
            None => "none".to_string(),
            Some(u) if u >= now => format!("in {:?}", u.since(now)),
            Some(u) => format!("{:?} ago", now.since(u)),
        };
        Ok(format!(
            "tx psn {} una {} sent_hi {} idx {} off {} rnr_until {} rnr_refusals {} retransmission timer {} (retries {}) engine timer {} {:?}; rx expected {} held {} reassembling {} rnr_owed {} {:?}; sq done {} tail {}; rq done {} tail {}",
            t.psn,
            t.una,
            t.sent_hi,
            t.idx,
            t.off,
            when(t.rnr_until),
            t.rnr_refusals,
            when(v.rtx.deadline()),
            v.rtx.retries(),
            when(e.core.timer_at),
            v.sack,
            r.expected,
            !r.reorder.is_empty(),
            r.msg.is_some(),
            r.rnr_owed,
            v.acks,
            v.sq.done,
            v.sq.tail,
            v.rq.done,
            v.rq.tail
        ))
    }

    /// `VipSetViAttributes`.
    pub fn vi_set_attributes(&self, id: u16, attrs: &ViAttributes) -> Result<()> {
        self.0.lock().core.set_vi_attributes(id, *attrs)
    }

    /// `VipPostSend` (`send`) / `VipPostRecv` of the descriptor at `addr`
    /// in the memory registered as `handle`.
    #[inline(always)]
    pub fn vi_post(&self, id: u16, addr: usize, handle: u32, send: bool) -> Result<()> {
        let mut e = self.0.lock();
        if send {
            e.post_send(id, addr, handle) // transmits now
        } else {
            e.core.post(id, addr, handle, Queue::Recv)
        }
    }

    /// Posts a send without ringing the doorbell: its frames leave with
    /// the next [`RawNic::ring_doorbell`] (or the next round of progress),
    /// so that several sends go out in one batch.
    pub fn vi_post_deferred(&self, id: u16, addr: usize, handle: u32) -> Result<()> {
        self.0.lock().core.post(id, addr, handle, Queue::Send)
    }

    /// Posts the sends `ds` to VI `id` in order (each named by `key`:
    /// address and memory handle) and rings the doorbell, all under one
    /// engine lock: how many were posted, and the error of the one refused
    /// (those after it are not posted).
    pub fn vi_post_sends<D>(&self, id: u16, ds: &[D], key: impl Fn(&D) -> (usize, u32)) -> (usize, Result<()>) {
        let mut e = self.0.lock();
        let mut r = Ok(());
        let mut n = 0;
        for d in ds {
            let (addr, handle) = key(d);
            r = e.core.post(id, addr, handle, Queue::Send);
            if r.is_err() {
                break;
            }
            n += 1;
        }
        e.ring_doorbell();
        (n, r)
    }

    /// Creates a shared receive queue of up to `depth` receives under
    /// `ptag` (an extension: `engine::srq`).
    pub fn srq_create(&self, ptag: Ptag, depth: usize) -> Result<u16> {
        self.0.lock().core.create_srq(ptag, depth)
    }

    /// Destroys shared receive queue `id` (refused while a VI uses it).
    pub fn srq_destroy(&self, id: u16) -> Result<()> {
        self.0.lock().core.destroy_srq(id)
    }

    /// Posts the receive descriptor at `addr` to shared receive queue `id`.
    pub fn srq_post(&self, id: u16, addr: usize, handle: u32) -> Result<()> {
        self.0.lock().core.srq_post(id, addr, handle)
    }

    /// Receives waiting in shared receive queue `id`.
    pub fn srq_len(&self, id: u16) -> Result<usize> {
        self.0.lock().core.srq_len(id)
    }

    /// VI `vi` draws its receives from shared receive queue `srq`.
    pub fn vi_use_srq(&self, vi: u16, srq: u16) -> Result<()> {
        self.0.lock().core.vi_use_srq(vi, srq)
    }

    /// Transmits what was posted with [`RawNic::vi_post_deferred`].
    pub fn ring_doorbell(&self) {
        self.0.lock().ring_doorbell();
    }

    /// `VipSendDone` / `VipRecvDone`: the address of the oldest completed
    /// descriptor.
    #[inline(always)]
    pub fn vi_done(&self, id: u16, send: bool) -> Result<Option<usize>> {
        // With nothing posted on the queue no round could complete
        // anything there: none is run (a reap's last poll).
        if send {
            self.0.poll(|e| e.core.nothing_posted(id, Queue::Send), |e| e.core.send_done(id).map(|(_, d)| d))
        } else {
            self.0.poll(|e| e.core.nothing_posted(id, Queue::Recv), |e| e.core.done(id, Queue::Recv).map(|(_, d)| d))
        }
    }

    /// `VipSendWait` / `VipRecvWait` (None: no limit). A disconnect by
    /// another thread flushes what is posted: the wait returns the flushed
    /// descriptor. A destroy by another thread ends it with INVALID_STATE.
    pub fn vi_wait(&self, id: u16, send: bool, timeout: Option<Duration>) -> Result<usize> {
        let what = if send { "SendWait" } else { "RecvWait" };
        let mut began_on = None;
        let gone = "the VI was destroyed while this thread waited on it";
        if send {
            self.0.wait(timeout, what, |e| still_the_same(&mut began_on, e.core.send_done(id), gone))
        } else {
            self.0.wait(timeout, what, |e| still_the_same(&mut began_on, e.core.done(id, Queue::Recv), gone))
        }
    }

    /// `VipConnectRequest` from VI `id` to the server at `mac` waiting on
    /// `discriminator`: NO_MATCH when nobody waits there, REJECT, TIMEOUT.
    pub fn vi_connect(&self, id: u16, mac: MacAddr, discriminator: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.connect_request(id, mac, discriminator, timeout, false)
    }

    /// [`RawNic::vi_connect`] whose one request is repeated while the server
    /// answers NO_MATCH, until it matches or `timeout` passes.
    pub fn vi_connect_until_matched(&self, id: u16, mac: MacAddr, discriminator: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.connect_request(id, mac, discriminator, timeout, true)
    }

    fn connect_request(&self, id: u16, mac: MacAddr, discriminator: &[u8], timeout: Option<Duration>, until_matched: bool) -> Result<()> {
        let limit = timeout.unwrap_or(FOREVER);
        {
            let mut e = self.0.lock();
            e.core.connect_request_begin(id, mac, discriminator, Instant::now() + limit)?;
            if until_matched {
                e.core.connect_request_until_matched(id);
            }
        }
        let r = self.0.wait(Some(limit + Duration::from_millis(50)), "ConnectRequest", |e| e.core.connect_request_poll(id).transpose());
        if r.as_ref().is_err_and(|e| e.code == VipReturn::Timeout) {
            self.0.lock().core.connect_request_cancel(id);
        }
        r
    }

    /// `VipConnectAccept` of request `conn` onto VI `id`.
    pub fn vi_accept(&self, conn: u32, id: u16) -> Result<()> {
        self.0.with(|e| e.core.accept(conn, id))?;
        // The client connects when the accept arrives: wait until it has
        // left (at once, unless its next hop is being resolved), so that a
        // server going on to block elsewhere does not keep it queued. Past
        // ANSWER_WAIT it goes with later progress.
        let left = |e: &mut crate::engine::Engine| Ok((!e.core.answer_queued(id, via_wire::Kind::ConnAccept)).then_some(()));
        let _ = self.0.wait(Some(ANSWER_WAIT), "ConnectAccept", left);
        Ok(())
    }

    /// `VipConnectReject` of request `conn`.
    pub fn reject(&self, conn: u32) -> Result<()> {
        self.0.with(|e| e.core.reject(conn))?;
        self.0.progress();
        Ok(())
    }

    /// `VipDisconnect`.
    pub fn vi_disconnect(&self, id: u16) -> Result<()> {
        self.0.with(|e| e.core.disconnect(id))?;
        self.0.progress();
        Ok(())
    }

    /// `VipConnectPeerRequest` (see [`crate::Vi::connect_peer_request`]).
    pub fn vi_peer_request(&self, id: u16, mac: MacAddr, local: &[u8], remote: &[u8], timeout: Option<Duration>) -> Result<()> {
        let deadline = Instant::now() + timeout.unwrap_or(FOREVER);
        self.0.with(|e| e.core.peer_request_begin(id, mac, local, remote, deadline))?;
        self.0.progress(); // send the first request now
        Ok(())
    }

    /// `VipConnectPeerDone`: true once connected, false while pending.
    pub fn vi_peer_done(&self, id: u16) -> Result<bool> {
        self.0.poll(|_| false, |e| e.core.peer_request_poll(id).transpose()).map(|r| r.is_some())
    }

    /// `VipConnectPeerWait`.
    pub fn vi_peer_wait(&self, id: u16) -> Result<()> {
        self.0.wait(None, "ConnectPeerWait", |e| e.core.peer_request_poll(id).transpose())
    }

    /// `VipCreateCQ`: returns the CQ's number.
    pub fn cq_create(&self, entries: usize) -> Result<u16> {
        self.0.lock().core.create_cq(entries)
    }

    /// `VipDestroyCQ`: INVALID_STATE while a VI uses it. A thread waiting
    /// on the CQ is woken and its wait ends with INVALID_STATE.
    pub fn cq_destroy(&self, id: u16) -> Result<()> {
        self.0.lock().core.destroy_cq(id)?;
        self.0.shared.wake_sleepers();
        self.0.shared.notifier.disarm(&[crate::NotifyTarget::Cq(id)]);
        Ok(())
    }

    /// `VipCQDone`: (VI, receive queue?) of the oldest completion.
    pub fn cq_done(&self, id: u16) -> Result<Option<(u16, bool)>> {
        self.0.poll(|_| false, |e| e.core.cq_done(id).map(|(_, c)| c))
    }

    /// `VipCQWait`; ends with INVALID_STATE when another thread destroys
    /// the CQ.
    pub fn cq_wait(&self, id: u16, timeout: Option<Duration>) -> Result<(u16, bool)> {
        let mut began_on = None;
        self.0.wait(timeout, "CQWait", |e| still_the_same(&mut began_on, e.core.cq_done(id), "the CQ was destroyed while this thread waited on it"))
    }

    /// [`RawNic::cq_wait`] that also ends, with None, when a peer-to-peer
    /// request that no VI here seeks has come (a program that connects
    /// on demand then answers it: [`RawNic::peer_requests_waiting`]).
    pub fn cq_wait_or_peer_request(&self, id: u16, timeout: Option<Duration>) -> Result<Option<(u16, bool)>> {
        let mut began_on = None;
        self.0.wait(timeout, "CQWait", |e| {
            if e.core.peers.has_waiting() {
                return Ok(Some(None));
            }
            still_the_same(&mut began_on, e.core.cq_done(id), "the CQ was destroyed while this thread waited on it").map(|c| c.map(Some))
        })
    }

    /// The peer-to-peer requests that no VI here sought when they came,
    /// since the last call (after a round of progress): each names the
    /// requester's MAC, its discriminator and the one it seeks here.
    pub fn peer_requests_waiting(&self) -> Vec<via_kernel_agent::peer::WaitingRequest> {
        self.0.with(|e| e.core.peers.take_waiting())
    }

    /// `VipResizeCQ`: fails when more completions are queued than fit.
    pub fn cq_resize(&self, id: u16, entries: usize) -> Result<()> {
        let mut e = self.0.lock();
        if entries == 0 || entries > crate::engine::MAX_CQ_ENTRIES || !e.core.cq_mut(id)?.resize(entries) {
            return Err(ViaError::resource(format!("cannot resize CQ to {entries} entries (more are queued, zero, or over MaxCQEntries)")));
        }
        Ok(())
    }

    /// The connected peer's VI attributes as it sent them (reliability
    /// bits, MaxTransferSize, RDMA write and read enables), if connected.
    pub fn vi_peer_attributes(&self, id: u16) -> Result<Option<(u16, u32, bool, bool)>> {
        let e = self.0.lock();
        let v = e.core.vi(id)?;
        Ok(v.peer.as_ref().map(|p| (p.attrs.reliability, p.attrs.max_transfer_size, p.attrs.enable_rdma_write, p.attrs.enable_rdma_read)))
    }
}
