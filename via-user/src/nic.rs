//! The Rust API's NIC handle: opening a device by name, protection tags,
//! completion queues, connection setup on the server side, the name
//! service, and the one wait loop every blocking call uses (spin briefly,
//! then sleep on the device's file descriptor).

use crate::engine::{AsyncError, Config, Counters, Engine, IncomingRequest, MAX_CQ, MAX_CQ_ENTRIES, MAX_SEGMENTS, MAX_TRANSFER_SIZE, MAX_VI};
use crate::shared::Shared;
use crate::vi::ViAttributes;
use crate::waker::sleep_on;
use crate::error::{Result, ViaError, VipReturn};
use crate::notify::{Notice, Notifier, NotifyTarget};
use crate::progress::CloseGate;
use std::mem::ManuallyDrop;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::engine_lock::{EngineGuard, EngineLock};
use std::sync::{Arc, Mutex};
use crate::clock::Time;
use std::time::{Duration, Instant};
use via_kernel_agent::memory::{Ptag, MAX_PTAGS, MAX_REGIONS};
use via_kernel_agent::names::NameService;
use via_kernel_agent::resolver::Lookup;
use via_wire::MAX_DISCRIMINATOR;
use via_device::{FrameDevice, MacAddr, RxWatches};

/// Rounds a wait keeps spinning after frames arrived that did not
/// complete it (a round is a look at the device: well under a
/// microsecond when nothing is there).
const BURST_ROUNDS: u32 = 64;
/// Looks at the device's watched words between two rounds of a spinning
/// wait (`via_device::watch`: one load each and a pause, some tens of
/// nanoseconds): the round after them reads the clock, runs the timers
/// and sees other threads' work, a few microseconds late at most.
const WATCH_LOOKS: u32 = 128;

/// An opened NIC (`VIP_NIC_HANDLE`). Cloning gives another handle to the
/// same NIC; it closes when the last handle and every object made from it
/// are gone.
pub struct Nic {
    /// Dropped by hand, through `gate` (see [`crate::progress::CloseGate`]).
    pub(crate) shared: ManuallyDrop<Arc<Shared>>,
    gate: Arc<CloseGate>,
}

impl Clone for Nic {
    fn clone(&self) -> Nic {
        Nic { shared: ManuallyDrop::new(Arc::clone(&self.shared)), gate: Arc::clone(&self.gate) }
    }
}

/// How long dropping a handle waits for control frames the device did not
/// take yet (see [`Nic::drop`]).
const LINGER: std::time::Duration = std::time::Duration::from_millis(100);

impl Drop for Nic {
    fn drop(&mut self) {
        // A disconnect (which carries the last ACK) that the device did not
        // take, because a peer's ring was full, say, would be lost with the
        // process, and the peer would wait out its retransmissions for an
        // answer. Such frames get a short while to leave.
        let until = std::time::Instant::now() + LINGER;
        while self.lock().core.cm.has_outgoing() && std::time::Instant::now() < until {
            self.progress();
            std::thread::yield_now();
        }
        // SAFETY: `shared` is taken once, here, and never used again.
        let shared = unsafe { ManuallyDrop::take(&mut self.shared) };
        self.gate.drop_handle(shared);
    }
}

/// `VIP_NIC_ATTRIBUTES`, the parts that are facts about this provider.
#[derive(Clone, Debug)]
pub struct NicAttributes {
    pub name: String,
    pub mac: MacAddr,
    /// Largest Ethernet payload of the device.
    pub native_mtu: usize,
    pub max_transfer_size: u32,
    pub max_vi: usize,
    pub max_cq: usize,
    pub max_segments_per_desc: usize,
    pub max_register_regions: usize,
    pub max_ptags: usize,
    pub max_discriminator_len: usize,
    pub thread_safe: bool,
    pub hardware_version: u64,
    pub provider_version: u64,
    /// Registration is bounded by the address space; on a device that pins
    /// registered memory (the tulip), also by RLIMIT_MEMLOCK, unless the
    /// process has CAP_IPC_LOCK (the other devices pin nothing).
    pub max_register_bytes: u64,
    pub max_register_block_bytes: u64,
    pub max_descriptors_per_queue: usize,
    /// A CQ grows past its size rather than lose a completion; this is the
    /// largest size `CreateCQ` accepts.
    pub max_cq_entries: usize,
    /// `VIP_RELIABILITY_LEVEL` bits: all three levels.
    pub reliability_level_support: u16,
    /// Levels on which RDMA read works: Reliable Delivery and Reception.
    pub rdma_read_support: u16,
}


/// `ProviderVersion`: 0x0001_0000 | minor.
pub const PROVIDER_VERSION: u64 = 0x0001_0003;

/// A completion queue's answer: which VI, which queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub vi: u16,
    pub recv_queue: bool,
}

impl Nic {
    /// Opens a device by its VIA name (see [`crate::open_device`]).
    pub fn open(name: &str) -> Result<Nic> {
        let dev = crate::open_device(name).map_err(|e| {
            // Out of memory (the rings could not be pinned: RLIMIT_MEMLOCK)
            // is a resource the caller may raise; anything else is the name.
            let code = if e.kind() == std::io::ErrorKind::OutOfMemory { VipReturn::ErrorResource } else { VipReturn::InvalidParameter };
            ViaError::new(code, e.to_string())
        })?;
        Self::with_device(name, dev, Config::from_env())
    }

    /// Runs the VI provider on an already opened device, with the
    /// background progress thread unless `config.progress_thread` is off.
    pub fn with_device(name: &str, dev: Box<dyn FrameDevice>, config: Config) -> Result<Nic> {
        let spin = config.spin;
        let background = config.progress_thread;
        let engine = Engine::new(dev, config)?;
        let fd = engine.wait_fd();
        let shared = Arc::new(Shared {
            engine: EngineLock::new(engine),
            fd,
            spin,
            name: name.to_string(),
            names: Mutex::new(None),
            calls: AtomicU64::new(0),
            background_rounds: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
            sleeper_fds: Mutex::new(Vec::new()),
            notifier: Notifier::default(),
        });
        let gate = Arc::new(CloseGate::default());
        if background {
            crate::progress::start(Arc::downgrade(&shared), Arc::clone(&gate)).map_err(|e| ViaError::io("starting the progress thread", e))?;
        }
        Ok(Nic { shared: ManuallyDrop::new(shared), gate })
    }

    /// Enters the engine on behalf of the application.
    pub(crate) fn lock(&self) -> EngineGuard<'_, Engine> {
        let g = self.shared.engine.lock();
        // Counted under the engine lock, which orders every increment: a
        // load and a store, no locked read-modify-write (this is on every
        // call's path; the progress thread only compares the value).
        let calls = &self.shared.calls;
        calls.store(calls.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        g
    }

    /// Do the two handles name the same opened NIC?
    pub fn same(&self, other: &Nic) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Rounds of progress the background thread has run.
    pub fn background_rounds(&self) -> u64 {
        self.shared.background_rounds.load(Ordering::Relaxed)
    }

    /// Runs `f` on the engine after one round of progress, then wakes the
    /// threads asleep in a wait: `f` may have completed or ended what they
    /// wait for (a disconnect flushes, a destroy removes).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> R {
        let r = {
            let mut e = self.lock();
            self.shared.run(&mut e);
            f(&mut e)
        };
        self.shared.wake_sleepers();
        self.shared.notifier.deliver();
        r
    }

    /// A poll (`Done`): answers at once when something is already
    /// complete, and otherwise runs one round of progress and asks again
    /// (unless the round would do nothing: `Engine::quiet`, or could
    /// give `f` nothing: `idle`, say a queue with nothing posted).
    pub(crate) fn poll<T>(&self, idle: impl FnOnce(&Engine) -> bool, mut f: impl FnMut(&mut Engine) -> Result<Option<T>>) -> Result<Option<T>> {
        let r = {
            let mut e = self.lock();
            if let Some(v) = f(&mut e)? {
                return Ok(Some(v));
            }
            if idle(&e) {
                return Ok(None);
            }
            // Nothing came and nothing is due: the round would find nothing.
            let now = e.core.clock.now();
            if self.shared.notifier.idle() && e.quiet(now) {
                return Ok(None);
            }
            self.shared.run_at(&mut e, now);
            f(&mut e)
        };
        self.shared.notifier.deliver();
        r
    }

    /// Drives the engine until `f` yields a value or `timeout` (None:
    /// forever) passes; spins for the configured time (on a device with
    /// watched words, until it has been quiet that long), then sleeps on
    /// the device. `what` names the wait in the timeout error.
    pub(crate) fn wait<T>(&self, timeout: Option<Duration>, what: &str, f: impl FnMut(&mut Engine) -> Result<Option<T>>) -> Result<T> {
        let r = self.wait_inner(timeout, what, f);
        self.shared.notifier.deliver();
        r
    }

    fn wait_inner<T>(&self, timeout: Option<Duration>, what: &str, mut f: impl FnMut(&mut Engine) -> Result<Option<T>>) -> Result<T> {
        // The wait starts at the first clock reading: a wait already
        // satisfied reads no clock at all. (The engine's clock costs a
        // counter read while its last reading is under a microsecond old:
        // `crate::clock`.)
        let mut start: Option<Time> = None;
        // The last round that found frames (else the start): the wait
        // spins until the device has been quiet for the spin time, not
        // merely until that long after it began. A wait that serves its
        // peers meanwhile (the RDMA reads and writes of a passive target,
        // which complete nothing here) kept sleeping between their
        // requests once its spin had run out: a wake-up per read (MTTL's
        // 32 B remote read 28 against 11 us).
        let mut active: Option<Time> = None;
        // Only where a look costs a load (a device that reports watched
        // words): a blind device's look is a whole round at the device
        // (the tulip's in a guest: exits to the hypervisor), so its waits
        // keep to the spin from their start.
        let mut watchable: Option<bool> = None;
        // Rounds still to spin because frames arrived without completing
        // the wait: the rest of a message comes right behind its first
        // frame, and sleeping between them (at once when VIA_SPIN_US=0,
        // as in oversubscribed runs) costs a wake-up per frame.
        let mut burst: u32 = 0;
        // Where the device's next frame will show, while nothing is queued
        // to go out: spun on between rounds instead of a round per look
        // (made at the first look that needs it: a wait its first round
        // completes, as a ping-pong's mostly are, never clears its table).
        let mut watches: Option<RxWatches> = None;
        // The time the last round ran at, when a watched word changed
        // since: the round it calls for runs at that time too, without a
        // clock read between the frame's arrival and its completion (a
        // counter read, ~10 ns in a VM, some 2 % of a shared-memory
        // one-way message). It is at most one spin (`WATCH_LOOKS` looks,
        // a few microseconds) older than a reading would be, which the
        // clock's own reuse of a reading allows already (`crate::clock`);
        // the round after it reads the clock again.
        let mut seen_since: Option<Time> = None;
        let mut round_at: Time;
        loop {
            if let Some(w) = watches.as_mut() {
                w.clear();
            }
            let sleep = {
                let mut e = self.lock();
                via_device::probe::mark(via_device::probe::Stage::Locked);
                // After a watched word changed, the round comes first: what
                // changed it is a frame this thread has yet to take (another
                // thread's round that took it leaves it to the look after).
                let watched = seen_since.take();
                if watched.is_none() {
                    if let Some(v) = f(&mut e)? {
                        return Ok(v); // already complete: no clock, no progress
                    }
                }
                let now = match watched {
                    Some(t) => t,
                    None => e.core.clock.now(),
                };
                round_at = now;
                let start = *start.get_or_insert(now);
                let deadline = timeout.map(|t| start + t);
                if self.shared.run_at(&mut e, now) {
                    burst = BURST_ROUNDS;
                    active = Some(now);
                }
                if let Some(v) = f(&mut e)? {
                    return Ok(v);
                }
                if deadline.is_some_and(|d| now >= d) {
                    return Err(ViaError::timeout(format!("{what}: timed out after {:?}", timeout.unwrap())));
                }
                // This thread's own wake-up eventfd: only this thread drains
                // it, so a wake-up written for it cannot be taken by another
                // sleeper. (Without one, out of fds, the wait keeps spinning.)
                let watchable = *watchable.get_or_insert_with(|| {
                    let mut w = RxWatches::default();
                    e.rx_watch(&mut w);
                    w.usable()
                });
                let since = if watchable { active.unwrap_or(start) } else { start };
                let spinning = burst > 0 || now.since(since) < self.shared.spin;
                // The device is told (a device that saw frames come
                // meanwhile: look again); the sleep ends when dropped.
                let wake = if spinning { None } else { crate::waker::thread_fd().ok().and_then(|fd| e.prepare_sleep().map(|s| (fd, s))) };
                if let Some((wake_fd, device_sleep)) = wake {
                    let now = Instant::now();
                    // Counted while still holding the lock, so a thread that
                    // completes our work after we let go sees us and wakes us.
                    self.register_sleeper(wake_fd);
                    let deadline = deadline.map(|d| e.core.clock.instant(d));
                    let until = match (deadline, e.next_deadline()) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    Some((wake_fd, device_sleep, until.map(|u| u.saturating_duration_since(now))))
                } else {
                    if burst == 0 && e.idle() {
                        e.rx_watch(watches.get_or_insert_with(RxWatches::default));
                    }
                    burst = burst.saturating_sub(1);
                    None
                }
            };
            match sleep {
                None if watches.as_ref().is_some_and(RxWatches::usable) => {
                    if watches.as_ref().is_some_and(|w| w.spin(WATCH_LOOKS)) {
                        seen_since = Some(round_at);
                    }
                }
                None => std::hint::spin_loop(),
                Some((wake_fd, device_sleep, t)) => {
                    sleep_on(&[self.shared.fd, wake_fd], t);
                    drop(device_sleep); // awake: said to the device at once
                    self.unregister_sleeper(wake_fd);
                    crate::waker::drain();
                }
            }
        }
    }

    /// Records this thread (its wake-up fd) as asleep in a wait.
    fn register_sleeper(&self, fd: RawFd) {
        self.shared.sleeper_fds.lock().unwrap_or_else(|p| p.into_inner()).push(fd);
        self.shared.sleepers.fetch_add(1, Ordering::Relaxed);
    }

    fn unregister_sleeper(&self, fd: RawFd) {
        let mut fds = self.shared.sleeper_fds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = fds.iter().position(|&f| f == fd) {
            fds.swap_remove(i);
        }
        self.shared.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Drives progress until `cond` holds or `timeout` passes, spinning
    /// then sleeping like the other waits: for an application that polls
    /// its own memory for what a peer's RDMA write put there.
    pub fn wait_until(&self, timeout: Option<Duration>, mut cond: impl FnMut() -> bool) -> Result<()> {
        self.wait(timeout, "wait_until", |_| Ok(cond().then_some(())))
    }

    /// Runs one round of progress (for callers that poll).
    pub fn progress(&self) {
        {
            let mut e = self.lock();
            self.shared.run(&mut e);
        }
        self.shared.notifier.deliver();
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn mac(&self) -> MacAddr {
        self.lock().core.mac
    }

    /// `VipQueryNic`.
    pub fn attributes(&self) -> NicAttributes {
        let e = self.lock();
        NicAttributes {
            name: self.shared.name.clone(),
            mac: e.core.mac,
            native_mtu: e.core.mtu,
            max_transfer_size: MAX_TRANSFER_SIZE,
            max_vi: MAX_VI,
            max_cq: MAX_CQ,
            max_segments_per_desc: MAX_SEGMENTS,
            max_register_regions: MAX_REGIONS,
            max_ptags: MAX_PTAGS,
            max_discriminator_len: MAX_DISCRIMINATOR,
            thread_safe: true,
            hardware_version: 0,
            provider_version: PROVIDER_VERSION,
            max_register_bytes: isize::MAX as u64,
            max_register_block_bytes: isize::MAX as u64,
            max_descriptors_per_queue: e.core.config.queue_depth.next_power_of_two(),
            max_cq_entries: MAX_CQ_ENTRIES,
            reliability_level_support: crate::vi::reliability::UNRELIABLE | crate::vi::reliability::RELIABLE_DELIVERY | crate::vi::reliability::RELIABLE_RECEPTION,
            rdma_read_support: crate::vi::reliability::RELIABLE_DELIVERY | crate::vi::reliability::RELIABLE_RECEPTION,
        }
    }

    /// The engine's counters.
    pub fn counters(&self) -> Counters {
        self.lock().core.counters
    }

    /// The device's own counters.
    pub fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.lock().dev.stats()
    }

    /// Asynchronous errors since the last call, when no error callback
    /// is set (with one set, they go to it instead).
    pub fn take_async_errors(&self) -> Vec<AsyncError> {
        std::mem::take(&mut self.lock().core.async_errors)
    }

    /// `VipErrorCallback`: `f` sees every asynchronous error from now on,
    /// from whichever thread runs progress (None: back to collecting them
    /// for [`Nic::take_async_errors`]).
    pub fn set_error_callback(&self, f: Option<Box<dyn FnMut(AsyncError) + Send>>) {
        self.shared.notifier.set_error_callback(f);
        self.progress(); // errors already pending go to the new callback
    }

    /// Arms a one-shot notification at the engine level: the next
    /// completion on `target` is taken off its queue and given to `f`.
    /// (The C ABI's notify calls; the Rust API wraps it per object.)
    pub fn notify(&self, target: NotifyTarget, f: Box<dyn FnOnce(Notice) + Send>) {
        self.shared.notifier.arm(target, f);
        self.progress(); // a completion already waiting is delivered now
    }

    /// `VipCreatePtag`.
    pub fn create_ptag(&self) -> Result<Ptag> {
        Ok(self.lock().core.mem.create_ptag()?)
    }

    /// `VipDestroyPtag`: fails with INVALID_STATE while a VI or region uses it.
    pub fn destroy_ptag(&self, tag: Ptag) -> Result<()> {
        Ok(self.lock().core.mem.destroy_ptag(tag)?)
    }

    /// `VipCreateVi`: a VI with optional completion queues for its send and
    /// receive queues.
    /// CQs of another NIC are refused (INVALID_PARAMETER).
    pub fn create_vi(&self, attrs: &ViAttributes, send_cq: Option<&crate::Cq>, recv_cq: Option<&crate::Cq>) -> Result<crate::Vi> {
        if [send_cq, recv_cq].into_iter().flatten().any(|c| !c.nic.same(self)) {
            return Err(ViaError::invalid("the completion queue belongs to another NIC"));
        }
        let id = self.raw().vi_create(attrs, send_cq.map(|c| c.id), recv_cq.map(|c| c.id))?;
        Ok(crate::Vi::owning(self, id))
    }

    /// The peer-to-peer requests (`VipConnectPeerRequest` of another
    /// process) that no VI here sought when they came, since the last
    /// call: the requester's MAC, its discriminator and the one it seeks
    /// here. A requester keeps retransmitting until its deadline, so a
    /// program that connects on demand answers by requesting in turn.
    pub fn peer_requests_waiting(&self) -> Vec<via_kernel_agent::peer::WaitingRequest> {
        self.raw().peer_requests_waiting()
    }

    /// A shared receive queue of up to `depth` receives under `ptag` (an
    /// extension: [`crate::Srq`]).
    pub fn create_srq(&self, ptag: crate::Ptag, depth: usize) -> Result<crate::Srq> {
        crate::Srq::create(self, ptag, depth)
    }

    /// `VipCreateCQ`.
    pub fn create_cq(&self, entries: usize) -> Result<crate::Cq> {
        let id = self.raw().cq_create(entries)?;
        Ok(crate::Cq { nic: self.clone(), id })
    }

    /// `VipConnectWait`: waits for a connection request addressed to
    /// `discriminator` on this NIC.
    pub fn connect_wait(&self, discriminator: &[u8], timeout: Option<Duration>) -> Result<IncomingRequest> {
        let wait = self.lock().core.connect_wait_begin(discriminator)?;
        let r = self.wait(timeout, "ConnectWait", |e| Ok(e.core.connect_wait_poll(wait)));
        if r.is_err() {
            self.lock().core.connect_wait_end(wait);
        }
        r
    }

    /// `VipConnectAccept`: connects `vi` to the client of `req`.
    pub fn accept(&self, req: &IncomingRequest, vi: &crate::Vi) -> Result<()> {
        self.raw().vi_accept(req.conn, vi.id())
    }

    /// `VipConnectReject`.
    pub fn reject(&self, req: &IncomingRequest) -> Result<()> {
        self.raw().reject(req.conn)
    }

    /// The hosts file, loaded on first use (and again after `ns_shutdown`).
    fn hosts(&self) -> Result<NameService> {
        let mut ns = self.shared.names.lock().unwrap_or_else(|p| p.into_inner());
        if ns.is_none() {
            *ns = Some(NameService::load_default().map_err(|e| ViaError::new(VipReturn::ErrorNameService, e.to_string()))?);
        }
        Ok(ns.as_ref().unwrap().clone())
    }

    /// How long a discovery query on the segment may take
    /// (`VIA_NS_TIMEOUT_MS`, default 500).
    fn discovery_timeout() -> Duration {
        Duration::from_millis(std::env::var("VIA_NS_TIMEOUT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500))
    }

    /// Runs discovery query `id` to its end.
    fn discover(&self, id: u32) -> Result<Option<(MacAddr, String)>> {
        self.wait(Some(Self::discovery_timeout() + Duration::from_millis(100)), "name discovery", |e| {
            Ok(match e.core.resolver.poll(id, Instant::now()) {
                Lookup::InProgress => None,
                Lookup::Found(mac, name) => Some(Some((mac, name))),
                Lookup::NotFound => Some(None),
            })
        })
    }

    /// `VipNSGetHostByName`: the MAC of `name` from the hosts file
    /// (`VIA_HOSTS`, default /etc/via/hosts), or `name` parsed as a MAC, or
    /// else whoever answers for it on the segment (a broadcast query).
    pub fn lookup_host(&self, name: &str) -> Result<MacAddr> {
        if let Some(mac) = self.hosts()?.lookup(name) {
            return Ok(mac);
        }
        if name.is_empty() || name.len() > via_kernel_agent::resolver::MAX_NAME {
            return Err(ViaError::new(VipReturn::ErrorNameService, format!("host name {name:?} is empty or longer than {} bytes", via_kernel_agent::resolver::MAX_NAME)));
        }
        let id = {
            let mut e = self.lock();
            if let Some(mac) = e.core.resolver.cached(name) {
                return Ok(mac);
            }
            let now = Instant::now();
            e.core.resolver.begin_name(name, now, now + Self::discovery_timeout())
        };
        match self.discover(id)? {
            Some((mac, _)) => Ok(mac),
            None => Err(ViaError::new(VipReturn::ErrorNameService, format!("host {name:?} is not in {} and no host on the segment answered for it", NameService::default_path().display()))),
        }
    }

    /// `VipNSGetHostByAddr`: the name of `mac` from the hosts file, or the
    /// one its VIA endpoint gives when asked.
    pub fn lookup_name(&self, mac: MacAddr) -> Result<String> {
        if let Some(n) = self.hosts()?.name_of(mac) {
            return Ok(n.to_string());
        }
        let id = {
            let mut e = self.lock();
            if let Some(n) = e.core.resolver.cached_name(mac) {
                return Ok(n.to_string());
            }
            let now = Instant::now();
            e.core.resolver.begin_addr(mac, now, now + Self::discovery_timeout())
        };
        match self.discover(id)? {
            Some((_, name)) => Ok(name),
            None => Err(ViaError::new(VipReturn::ErrorNameService, format!("{mac} is not in {} and gave no name when asked", NameService::default_path().display()))),
        }
    }

    /// `VipNSInit`: (re)loads the hosts file; `names` are the names this
    /// NIC answers for on the segment (None: `$VIA_NAME` or the host name,
    /// plus its hosts-file names).
    pub fn ns_init(&self, names: Option<Vec<String>>) -> Result<()> {
        *self.shared.names.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let hosts = self.hosts()?;
        let mut e = self.lock();
        let names = names.unwrap_or_else(|| via_kernel_agent::resolver::default_local_names(&hosts, e.core.mac));
        e.core.resolver.set_local_names(names);
        Ok(())
    }

    /// `VipNSShutdown`: forgets the hosts file and what discovery learnt.
    pub fn ns_shutdown(&self) {
        *self.shared.names.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.lock().core.resolver.shutdown();
    }
}
