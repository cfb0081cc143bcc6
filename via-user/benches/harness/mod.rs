//! What `engine_cost` and `read_cost` share: two NICs in one thread
//! joined by an in-memory queue device (or the shared-memory wire, or
//! that wire in composite devices), connected VIs and registered memory,
//! and the ends' send/receive and RDMA-write ping-pong steps. A module of
//! each bench binary, so that one bench's loop cannot change how the
//! compiler lays out the other's.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use via_device::{Capabilities, FrameDevice, MacAddr, RxFilter, RxWatch, RxWatches, TxFrame};
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Op, Reliability, ViAttributes};

/// One direction of the in-memory wire: frames in flight, and spent
/// buffers kept for the next frames, so the harness allocates nothing per
/// frame (its cost stays out of the engine's count).
#[derive(Default)]
pub struct WireQueue {
    frames: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

/// The queue and a count of the frames ever pushed onto it, the word a
/// waiting receiver watches (`via_device::watch`).
#[derive(Default)]
pub struct WireState {
    queue: Mutex<WireQueue>,
    pushed: AtomicU64,
    popped: AtomicU64,
}

pub type Wire = Arc<WireState>;

/// Frames written to `tx` are read from the peer's `rx`. On a wire nobody
/// writes it is a composite's idle NIC (`DEVICE=composite`): one look at
/// its counts a round, as at a TPACKET ring's next slot.
pub struct QueueDevice {
    mac: MacAddr,
    rx: Wire,
    tx: Wire,
    /// Never readable (waits here spin); a composite polls it beside the wire's.
    fd: via_device::EventFd,
    /// `VOUCHED=1`: a path that cannot corrupt, so frames carry no CRC
    /// (as VIA in UDP, whose checksum is offloaded): the engine's own cost.
    checksummed: bool,
}

impl QueueDevice {
    fn new(mac: MacAddr, rx: Wire, tx: Wire) -> Box<QueueDevice> {
        Box::new(QueueDevice { mac, rx, tx, fd: via_device::EventFd::new().unwrap(), checksummed: std::env::var_os("VOUCHED").is_some() })
    }
}

impl FrameDevice for QueueDevice {
    fn mac(&self) -> MacAddr {
        self.mac
    }
    fn mtu(&self) -> usize {
        1500
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: self.checksummed, ..Capabilities::default() }
    }
    fn wait_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
    fn set_filter(&mut self, _: RxFilter) -> io::Result<()> {
        Ok(())
    }
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        if self.rx.pushed.load(Ordering::Acquire) == self.rx.popped.load(Ordering::Relaxed) {
            return Ok(0); // nothing came: the lock is not taken
        }
        let mut q = self.rx.queue.lock().unwrap();
        let mut n = 0;
        while n < budget {
            let Some(f) = q.frames.pop_front() else { break };
            sink(&f);
            q.spare.push(f);
            n += 1;
        }
        self.rx.popped.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let mut q = self.tx.queue.lock().unwrap();
        for f in frames {
            let mut b = q.spare.pop().unwrap_or_default();
            b.clear();
            f.append_to(&mut b);
            q.frames.push_back(b);
        }
        self.tx.pushed.fetch_add(frames.len() as u64, Ordering::Release);
        Ok(frames.len())
    }
    fn rx_watch(&self, w: &mut RxWatches) {
        let pushed = self.rx.pushed.load(Ordering::Acquire);
        if pushed != self.rx.popped.load(Ordering::Relaxed) {
            w.ready();
        }
        // SAFETY: the count lives in the wire, which the device holds.
        w.push(unsafe { RxWatch::u64(&self.rx.pushed, pushed) });
    }
    /// One look, as a TPACKET ring's or a NIC's next slot is looked at
    /// (the trait's default collects the watches to say it).
    fn rx_pending(&self) -> Option<bool> {
        Some(self.rx.pushed.load(Ordering::Acquire) != self.rx.popped.load(Ordering::Relaxed))
    }
}

/// How the two ends ping-pong.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    /// Send into the peer's posted receive.
    SendRecv,
    /// RDMA-write into the peer's memory; the peer polls the last byte.
    RdmaWrite,
}

/// Both ends of one connection over the queue device.
pub struct End {
    pub nic: Nic,
    pub vi: via_user::Vi,
    pub mem: MemoryRegion,
    pub spare: Vec<Descriptor>,
}

/// The two devices joined: the in-memory queue (`DEVICE=queue`, the
/// default); the real shared-memory wire (`DEVICE=shm`, two ports of one
/// segment: what via-shm's frames cost, no CRC since that path vouches
/// for its frames); or that wire in composite devices beside an idle NIC
/// (`DEVICE=composite`: via-shm as the demo runs it).
pub fn devices() -> (Box<dyn FrameDevice>, Box<dyn FrameDevice>) {
    let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let device = std::env::var("DEVICE").unwrap_or_default();
    if device == "shm" || device == "composite" {
        let wire = format!("engine-cost-{}", std::process::id());
        let (a, b): (Box<dyn FrameDevice>, Box<dyn FrameDevice>) = if device == "shm" {
            (Box::new(via_softnic::ShmDevice::open(&wire, Some(ma)).unwrap()), Box::new(via_softnic::ShmDevice::open(&wire, Some(mb)).unwrap()))
        } else {
            let end = |mac| {
                let idle: Wire = Default::default();
                let nic: Box<dyn FrameDevice> = QueueDevice::new(mac, idle.clone(), idle);
                Box::new(via_softnic::CompositeDevice::new(vec![("idle".into(), nic)], Some(&wire), &[]).unwrap())
            };
            (end(ma), end(mb))
        };
        via_softnic::shm::remove_wire(&wire); // the mappings stay
        return (a, b);
    }
    let (ab, ba): (Wire, Wire) = Default::default();
    (QueueDevice::new(ma, ba.clone(), ab.clone()), QueueDevice::new(mb, ab, ba))
}

/// The message size (`SIZE`, default 64 bytes: the one the instruction
/// target counts; `SIZE=65536` shows the cost of a message of many frames).
pub fn size() -> usize {
    // Read once: the measured loop asks for it every message.
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| std::env::var("SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(64).max(1))
}

/// Each end's buffer: `half` bytes to send from, then `half` to receive into.
pub fn half() -> usize {
    size().next_multiple_of(4096)
}

/// `read`: the VIs and memory enable RDMA reads (`read_cost`).
pub fn connected_pair(mode: Mode, read: bool) -> (End, End) {
    // Waits spin throughout (the queue device has no fd to sleep on).
    let cfg = Config { progress_thread: false, spin: Duration::from_secs(60), ..Config::from_env() };
    let (da, db) = devices();
    let a = Nic::with_device("a", da, cfg.clone()).unwrap();
    let b = Nic::with_device("b", db, cfg).unwrap();
    let rdma = mode == Mode::RdmaWrite;
    let setup = |nic: &Nic| {
        let ptag = nic.create_ptag().unwrap();
        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: half() as u32, ptag, enable_rdma_write: rdma, enable_rdma_read: read };
        let mut vi = nic.create_vi(&attrs, None, None).unwrap();
        let mem = MemoryRegion::new(nic, 2 * half(), 4096, MemAttributes { ptag, enable_rdma_write: rdma, enable_rdma_read: read }).unwrap();
        // RECV_SEGS=2: receives of two segments (a 32-byte header, then
        // the rest), a common VIA layout (via-pingpong's).
        let mut recv = Descriptor::new(nic, ptag, 2).unwrap();
        if std::env::var("RECV_SEGS").as_deref() == Ok("2") {
            recv.set(&[(&mem, half()..half() + 32), (&mem, half() + 32..2 * half())], None).unwrap();
        } else {
            recv.set(&[(&mem, half()..2 * half())], None).unwrap();
        }
        vi.post_recv(recv).unwrap();
        let spare = (0..16).map(|_| Descriptor::new(nic, ptag, 1).unwrap()).collect();
        End { nic: nic.clone(), vi, mem, spare }
    };
    let ea = setup(&a);
    let eb = setup(&b);
    let bmac = b.mac();
    // Connect: the server's wait must run while the client's request is in flight.
    let server = std::thread::spawn(move || {
        let req = b.connect_wait(b"bench", Some(Duration::from_secs(5))).unwrap();
        b.accept(&req, &eb.vi).unwrap();
        eb
    });
    let mut ea = ea;
    ea.vi.connect_retrying(bmac, b"bench", Duration::from_secs(5)).unwrap();
    (ea, server.join().unwrap())
}

impl End {
    /// Sends (or RDMA-writes into `peer`'s receive half) `size()` bytes whose
    /// last byte is `tag`.
    pub fn ping(&mut self, mode: Mode, peer: &via_user::RemoteBuffer, tag: u8) {
        let n = size();
        self.mem.write(n - 1, &[tag]).unwrap();
        let mut d = self.spare.pop().expect("send descriptors");
        if d.length() as usize != n {
            let op = if mode == Mode::RdmaWrite { Op::RdmaWrite(*peer) } else { Op::SendRecv };
            d.set_op(op, &[(&self.mem, 0..n)], None, false).unwrap();
        }
        self.vi.post_send(d).unwrap();
    }

    /// Waits for the peer's `size()` bytes tagged `tag`.
    pub fn pong(&mut self, mode: Mode, tag: u8) {
        match mode {
            Mode::SendRecv => {
                let r = self.vi.recv_wait(None).unwrap();
                self.vi.post_recv(r).unwrap();
            }
            Mode::RdmaWrite => {
                let mem = &self.mem;
                self.nic
                    .wait_until(None, || {
                        let mut b = [0u8];
                        mem.read(half() + size() - 1, &mut b).unwrap();
                        b[0] == tag
                    })
                    .unwrap();
            }
        }
    }

    pub fn reap(&mut self) {
        while let Some(d) = self.vi.send_done().unwrap() {
            self.spare.push(d);
        }
    }
}

