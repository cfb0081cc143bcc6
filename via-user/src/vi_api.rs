//! The Rust API's VI and completion queue.
//!
//! A [`Vi`] owns the descriptors posted to it: posting moves a
//! [`Descriptor`] in, `Done`/`Wait` hand it back once the engine completed
//! it (in posting order), with its status, length and immediate data filled
//! in. Dropping a VI disconnects it and destroys it.
//!
//! Both are owners wrapped around the id-level calls of [`crate::RawNic`]:
//! what they add is ownership (of the VI or CQ number, of the posted
//! descriptors), never a second way to do an operation.

use crate::engine::post::Queue;
use crate::error::{Result, ViaError};
use crate::raw::RawNic;
use crate::nic::{Completion, Nic};
use crate::region::Descriptor;
use crate::vi::{ViAttributes, ViPhase};
use crate::notify::{Notice, NotifyTarget};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use via_wire::MacAddr;

/// A virtual interface (`VIP_VI_HANDLE`).
pub struct Vi {
    nic: Nic,
    id: u16,
    /// Still to be destroyed when dropped (false after `destroy`).
    owned: bool,
    /// Descriptors posted and not yet handed back, per queue, oldest first:
    /// the engine completes each queue in this order.
    sent: VecDeque<Descriptor>,
    received: VecDeque<Descriptor>,
    /// Per queue (send, receive): a notification is armed. `Done`/`Wait` on
    /// that queue are refused until it fired, since it owns the next
    /// completion.
    armed: [Arc<AtomicBool>; 2],
    /// A notification armed while its queue was empty: it takes the next
    /// descriptor posted there.
    on_post: [Option<DescriptorCallback>; 2],
    /// Per queue: a notification was set up there and may still stand, so
    /// posts and completions look at `armed` and `on_post`; false while
    /// none was since they last found both clear (a plain flag: the calls
    /// of a VI that never asks for notifications test one byte).
    noticing: [bool; 2],
    /// The shared receive queue's descriptors, when the VI draws its
    /// receives from one (they are handed back from there).
    pool: Option<crate::srq_api::PoolDescriptors>,
}

type DescriptorCallback = Box<dyn FnOnce(Descriptor) + Send>;

fn qi(q: Queue) -> usize {
    match q {
        Queue::Send => 0,
        Queue::Recv => 1,
    }
}

impl Vi {
    /// Owns VI `id` of `nic`, just created.
    pub(crate) fn owning(nic: &Nic, id: u16) -> Vi {
        Vi { nic: nic.clone(), id, owned: true, sent: VecDeque::new(), received: VecDeque::new(), armed: Default::default(), on_post: [None, None], noticing: [false; 2], pool: None }
    }

    /// Draws this VI's receives from `srq` (an extension): allowed while
    /// the VI is idle with no receive posted; from then on receives are
    /// posted to the pool, not the VI, and `RecvDone`/`RecvWait` hand
    /// back the pool's descriptors that messages to this VI took.
    pub fn use_srq(&mut self, srq: &crate::Srq) -> Result<()> {
        if !srq.nic().same(&self.nic) {
            return Err(ViaError::invalid("the shared receive queue belongs to another NIC"));
        }
        self.raw().vi_use_srq(self.id, srq.id())?;
        self.pool = Some(srq.descriptors());
        Ok(())
    }

    fn raw(&self) -> &RawNic {
        self.nic.raw()
    }

    /// The VI's number on its NIC (what completion queues report).
    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// `VipQueryVi`: state and attributes.
    pub fn state(&self) -> ViPhase {
        self.raw().vi_query(self.id).map(|q| q.0).unwrap_or(ViPhase::Error)
    }

    /// `VipDestroyVi`: refused with INVALID_STATE while the VI is connected
    /// or has descriptors posted that were not handed back (the VI is
    /// returned with the error). Dropping a VI instead tears it down
    /// regardless.
    // The VI itself comes back with the error, as VIPL's caller keeps its
    // handle: a large Err is the point.
    #[allow(clippy::result_large_err)]
    pub fn destroy(mut self) -> std::result::Result<(), (Vi, ViaError)> {
        match self.raw().vi_destroy(self.id) {
            Ok(()) => {
                self.owned = false;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// `VipQueryVi`: state, attributes, and whether the send and receive
    /// queues are empty (nothing posted that was not handed back).
    pub fn query(&self) -> (ViPhase, ViAttributes, bool, bool) {
        self.raw().vi_query(self.id).expect("VI exists while the handle does")
    }

    /// The VI's sequenced streams in words, for diagnostics
    /// ([`RawNic::vi_transport_state`](crate::RawNic::vi_transport_state)).
    pub fn transport_state(&self) -> String {
        self.raw().vi_transport_state(self.id).unwrap_or_else(|e| e.to_string())
    }

    /// `VipSetViAttributes`: reliability level and MaxTransferSize change
    /// only while the VI is Idle; the protection tag (which must exist) and
    /// the RDMA enable bits at any time.
    pub fn set_attributes(&mut self, attrs: &ViAttributes) -> Result<()> {
        self.raw().vi_set_attributes(self.id, attrs)
    }

    pub fn attributes(&self) -> ViAttributes {
        self.query().1
    }

    /// `VipConnectRequest`: connects to the server at `mac` waiting on
    /// `discriminator`. Gives NO_MATCH when nobody waits there (retry),
    /// REJECT when refused, TIMEOUT when nobody answers.
    pub fn connect(&mut self, mac: MacAddr, discriminator: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.raw().vi_connect(self.id, mac, discriminator, timeout)
    }

    /// [`Vi::connect`] that waits for the server to wait: its one request
    /// is repeated while the answer is NO_MATCH (the server is not in
    /// ConnectWait yet), until `timeout` in all. (A program retrying
    /// `VipConnectRequest` after NO_MATCH sends a new request each time; a
    /// late copy of an abandoned one could then be accepted at the server
    /// for nobody. One request cannot be.)
    pub fn connect_retrying(&mut self, mac: MacAddr, discriminator: &[u8], timeout: Duration) -> Result<()> {
        self.raw().vi_connect_until_matched(self.id, mac, discriminator, Some(timeout))
    }

    /// `VipConnectPeerRequest`: starts connecting to the peer at `mac`
    /// that names us `local` and itself `remote` (it makes the same call
    /// the other way round). Returns at once; `connect_peer_done` polls,
    /// `connect_peer_wait` waits. The request gives up after `timeout`
    /// (None: no limit).
    pub fn connect_peer_request(&mut self, mac: MacAddr, local: &[u8], remote: &[u8], timeout: Option<Duration>) -> Result<()> {
        self.raw().vi_peer_request(self.id, mac, local, remote, timeout)
    }

    /// `VipConnectPeerDone`: Ok(true) once connected, Ok(false) while
    /// pending (VIP_NOT_DONE), or the request's error (TIMEOUT, REJECT,
    /// INVALID_RELIABILITY_LEVEL, INVALID_MTU, INVALID_RDMAREAD).
    pub fn connect_peer_done(&mut self) -> Result<bool> {
        self.raw().vi_peer_done(self.id)
    }

    /// `VipConnectPeerWait`: waits until the peer request settles.
    pub fn connect_peer_wait(&mut self) -> Result<()> {
        self.raw().vi_peer_wait(self.id)
    }

    /// `VipDisconnect`: everything posted completes as flushed and can be
    /// collected with the Done calls.
    pub fn disconnect(&mut self) -> Result<()> {
        self.raw().vi_disconnect(self.id)
    }

    /// Posts several sends and rings the doorbell once, so that their
    /// frames leave in one batch (a chain of work requests in one post, as
    /// RDMA verbs has it). Stops at the first descriptor the engine
    /// refuses; those before it stay posted.
    pub fn post_sends(&mut self, ds: impl IntoIterator<Item = Descriptor>) -> Result<()> {
        // The chain is gathered first: nothing of the caller's (its
        // iterator, a descriptor's drop) runs under the engine lock.
        let mut chain: Vec<Descriptor> = ds.into_iter().collect();
        let r = if self.noticing[qi(Queue::Send)] {
            // A notification may take the first: one post at a time.
            let mut r = Ok(());
            for d in chain.drain(..) {
                r = self.raw().vi_post_deferred(self.id, d.addr(), d.handle());
                if r.is_err() {
                    break;
                }
                self.keep(d, Queue::Send);
            }
            self.raw().ring_doorbell();
            r
        } else {
            // One engine lock for the whole chain and its doorbell.
            let (n, r) = self.raw().vi_post_sends(self.id, &chain, |d| (d.addr(), d.handle()));
            self.sent.extend(chain.drain(..n));
            r
        };
        drop(chain); // the refused descriptor and those after it
        r
    }

    #[inline(always)]
    fn post(&mut self, d: Descriptor, q: Queue) -> Result<()> {
        self.raw().vi_post(self.id, d.addr(), d.handle(), q == Queue::Send)?;
        self.keep(d, q);
        Ok(())
    }

    /// Keeps `d`, just posted on `q`, until the engine hands it back.
    #[inline]
    fn keep(&mut self, d: Descriptor, q: Queue) {
        match self.noticing[qi(q)].then(|| self.on_post[qi(q)].take()).flatten() {
            Some(f) => self.arm(q, d, f), // its queue was empty: this is the next to complete
            None => self.list(q).push_back(d),
        }
    }

    fn list(&mut self, q: Queue) -> &mut VecDeque<Descriptor> {
        match q {
            Queue::Send => &mut self.sent,
            Queue::Recv => &mut self.received,
        }
    }

    /// `VipPostSend`.
    pub fn post_send(&mut self, d: Descriptor) -> Result<()> {
        via_device::probe::mark(via_device::probe::Stage::Posted);
        self.post(d, Queue::Send)
    }

    /// `VipPostRecv`.
    pub fn post_recv(&mut self, d: Descriptor) -> Result<()> {
        self.post(d, Queue::Recv)
    }

    /// Takes the descriptor the engine handed back at `addr` off our list:
    /// always the oldest, since each queue completes in posting order and a
    /// notification owns the oldest while it is armed.
    #[inline(always)]
    fn take(&mut self, q: Queue, addr: usize) -> Descriptor {
        if let (Queue::Recv, Some(pool)) = (q, &self.pool) {
            return pool.take(addr);
        }
        let d = self.list(q).pop_front().expect("engine completed a descriptor this VI posted");
        debug_assert_eq!(d.addr(), addr);
        d
    }

    /// Arms the engine notification of `q` with `d`, the next descriptor
    /// to complete there.
    fn arm(&mut self, q: Queue, d: Descriptor, f: DescriptorCallback) {
        let flag = self.armed[qi(q)].clone();
        flag.store(true, Ordering::Release);
        let target = if q == Queue::Send { NotifyTarget::Send(self.id) } else { NotifyTarget::Recv(self.id) };
        self.nic.notify(
            target,
            Box::new(move |n| {
                if let Notice::Descriptor(addr) = n {
                    debug_assert_eq!(addr, d.addr());
                    flag.store(false, Ordering::Release);
                    f(d);
                }
            }),
        );
    }

    fn notify(&mut self, q: Queue, f: impl FnOnce(Descriptor) + Send + 'static) -> Result<()> {
        if self.armed[qi(q)].load(Ordering::Acquire) || self.on_post[qi(q)].is_some() {
            return Err(ViaError::state(format!("a notification is already armed on the {q:?} queue")));
        }
        self.noticing[qi(q)] = true;
        if let (Queue::Recv, Some(pool)) = (q, self.pool.clone()) {
            // Which of the pool's descriptors completes next is known only
            // when a message takes one: the notice names it.
            let flag = self.armed[qi(q)].clone();
            flag.store(true, Ordering::Release);
            self.nic.notify(
                NotifyTarget::Recv(self.id),
                Box::new(move |n| {
                    if let Notice::Descriptor(addr) = n {
                        flag.store(false, Ordering::Release);
                        f(pool.take(addr));
                    }
                }),
            );
            return Ok(());
        }
        match self.list(q).pop_front() {
            Some(d) => self.arm(q, d, Box::new(f)),
            None => self.on_post[qi(q)] = Some(Box::new(f)),
        }
        Ok(())
    }

    #[inline]
    fn check_unarmed(&mut self, q: Queue) -> Result<()> {
        if self.noticing[qi(q)] {
            if self.armed[qi(q)].load(Ordering::Acquire) || self.on_post[qi(q)].is_some() {
                return Err(ViaError::state(format!("a notification armed on the {q:?} queue owns its next completion")));
            }
            self.noticing[qi(q)] = false;
        }
        Ok(())
    }

    /// `VipSendNotify`: the next send to complete is taken off the queue
    /// and handed to `f` (once), on whichever thread runs progress.
    /// While it is armed, `SendDone`/`SendWait` give INVALID_STATE.
    pub fn send_notify(&mut self, f: impl FnOnce(Descriptor) + Send + 'static) -> Result<()> {
        self.notify(Queue::Send, f)
    }

    /// `VipRecvNotify`.
    pub fn recv_notify(&mut self, f: impl FnOnce(Descriptor) + Send + 'static) -> Result<()> {
        self.notify(Queue::Recv, f)
    }

    #[inline(always)]
    fn done(&mut self, q: Queue) -> Result<Option<Descriptor>> {
        self.check_unarmed(q)?;
        // Nothing of ours is posted there (and no shared pool feeds it):
        // nothing can complete, and the engine is not asked. (A reap that
        // polls until it finds none ends here: a round trip's worth of
        // lock, look and round.)
        if self.list(q).is_empty() && (q == Queue::Send || self.pool.is_none()) {
            return Ok(None);
        }
        let r = self.raw().vi_done(self.id, q == Queue::Send)?;
        Ok(r.map(|a| self.take(q, a)))
    }

    #[inline(always)]
    fn wait(&mut self, q: Queue, timeout: Option<Duration>) -> Result<Descriptor> {
        self.check_unarmed(q)?;
        let a = self.raw().vi_wait(self.id, q == Queue::Send, timeout)?;
        via_device::probe::mark(via_device::probe::Stage::WaitReturned);
        Ok(self.take(q, a))
    }

    /// `VipSendDone`: the oldest completed send, if any (None at once,
    /// without a look at the engine, when this VI has no send posted).
    pub fn send_done(&mut self) -> Result<Option<Descriptor>> {
        self.done(Queue::Send)
    }

    /// `VipRecvDone` (None at once when no receive is posted, unless
    /// the VI draws its receives from a shared queue).
    pub fn recv_done(&mut self) -> Result<Option<Descriptor>> {
        self.done(Queue::Recv)
    }

    /// `VipSendWait` (None: wait forever).
    pub fn send_wait(&mut self, timeout: Option<Duration>) -> Result<Descriptor> {
        self.wait(Queue::Send, timeout)
    }

    /// `VipRecvWait`.
    pub fn recv_wait(&mut self, timeout: Option<Duration>) -> Result<Descriptor> {
        self.wait(Queue::Recv, timeout)
    }

    /// Descriptors posted and not yet handed back (send, receive).
    pub fn posted(&self) -> (usize, usize) {
        (self.sent.len(), self.received.len())
    }
}

impl Drop for Vi {
    fn drop(&mut self) {
        if self.owned {
            self.raw().vi_tear_down(self.id);
        }
    }
}

/// A completion queue (`VIP_CQ_HANDLE`).
pub struct Cq {
    pub(crate) nic: Nic,
    pub(crate) id: u16,
}

impl Cq {
    fn raw(&self) -> &RawNic {
        self.nic.raw()
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    /// `VipCQDone`.
    pub fn done(&self) -> Result<Option<Completion>> {
        Ok(self.raw().cq_done(self.id)?.map(|(vi, recv)| Completion { vi, recv_queue: recv }))
    }

    /// `VipCQWait`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Completion> {
        let (vi, recv) = self.raw().cq_wait(self.id, timeout)?;
        Ok(Completion { vi, recv_queue: recv })
    }

    /// [`Cq::wait`] that also ends, with None, when a peer-to-peer
    /// request that no VI of this NIC seeks arrives (see
    /// [`Nic::peer_requests_waiting`](crate::Nic::peer_requests_waiting)):
    /// for programs that connect to a peer when it first asks.
    pub fn wait_or_peer_request(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        Ok(self.raw().cq_wait_or_peer_request(self.id, timeout)?.map(|(vi, recv_queue)| Completion { vi, recv_queue }))
    }

    /// `VipCQNotify`: the next completion is taken off the CQ and handed
    /// to `f` (once), on whichever thread runs progress.
    pub fn notify(&self, f: impl FnOnce(Completion) + Send + 'static) {
        self.nic.notify(
            NotifyTarget::Cq(self.id),
            Box::new(move |n| {
                if let Notice::Completion(vi, recv_queue) = n {
                    f(Completion { vi, recv_queue });
                }
            }),
        );
    }

    /// `VipResizeCQ`.
    pub fn resize(&self, entries: usize) -> Result<()> {
        self.raw().cq_resize(self.id, entries)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // Refused only while a VI uses it, which its VIs' own Nic handles
        // keep from happening before they are dropped.
        let _ = self.raw().cq_destroy(self.id);
    }
}
