//! Devices for the tests, each wrapping another (the in-process loopback):
//! [`DroppingDevice`] loses the transmitted frames a test picks;
//! [`Superframing`] hands received frames on as a superframe's units, and
//! may change one on the way. And [`OneMessage`]: a peer that accepts a
//! connection and receives one message.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;
use via_device::{Ahead, Capabilities, FrameDevice, MacAddr, RxFilter, RxMeta, Sleep, TxFrame};
use via_user::{Counters, Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, ViAttributes};
use via_wire::{Kind, ETH_HEADER_LEN, TAG_LEN};

/// The `FrameDevice` methods a wrapper leaves to its `inner` device.
macro_rules! forward_to_inner {
    () => {
        fn mac(&self) -> MacAddr {
            self.inner.mac()
        }
        fn mtu(&self) -> usize {
            self.inner.mtu()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        fn wait_fd(&self) -> RawFd {
            self.inner.wait_fd()
        }
        fn prepare_sleep(&mut self) -> Option<Sleep> {
            self.inner.prepare_sleep()
        }
        fn set_filter(&mut self, f: RxFilter) -> io::Result<()> {
            self.inner.set_filter(f)
        }
    };
}

/// `inner`, losing every transmitted frame whose header `drops` picks
/// ("sent", and lost on the wire).
#[allow(dead_code)] // (each test binary uses some of this module)
pub struct DroppingDevice {
    pub inner: Box<dyn FrameDevice>,
    pub drops: Box<dyn FnMut(&[u8]) -> bool + Send>,
}

impl FrameDevice for DroppingDevice {
    forward_to_inner!();
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.inner.receive(budget, sink)
    }
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        for (i, f) in frames.iter().enumerate() {
            if (self.drops)(f.header) {
                continue; // "sent", and lost on the wire
            }
            if self.inner.transmit(std::slice::from_ref(f))? == 0 {
                return Ok(i);
            }
        }
        Ok(frames.len())
    }
}

/// `inner`'s received frames handed on as a superframe's units: each run
/// of frames of one length laid end to end in one buffer (VIA header
/// onward), each handed with the rest of its run as [`Ahead`] and its
/// Ethernet header written over the tail of the unit before (handed on
/// already), as `via_softnic`'s packet device does. The first time a run
/// of at least four data frames comes, the payload of its unit at
/// `corrupt_at` (< 4) has a bit flipped (counted in `corrupted`).
#[allow(dead_code)] // (each test binary uses some of this module)
pub struct Superframing {
    pub inner: Box<dyn FrameDevice>,
    pub corrupt_at: usize,
    pub corrupted: Arc<AtomicUsize>,
}

impl FrameDevice for Superframing {
    forward_to_inner!();
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        self.inner.transmit(frames)
    }
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.receive_lent(budget, &mut |f, _| sink(f))
    }
    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        let mut frames: Vec<(Vec<u8>, bool)> = Vec::new();
        let n = self.inner.receive_lent(budget, &mut |f, meta| {
            assert!(meta.lent.is_none(), "a keyed sender never lends");
            frames.push((f.to_vec(), meta.vouched));
        })?;
        let mut i = 0;
        while i < frames.len() {
            let len = frames[i].0.len();
            let end = i + frames[i..].iter().take_while(|(f, _)| f.len() == len).count();
            let unit = len - ETH_HEADER_LEN;
            let data = |f: &Vec<u8>| f[ETH_HEADER_LEN + 1] == Kind::Data as u8;
            if end - i >= 4 && frames[i..end].iter().all(|(f, _)| data(f)) && self.corrupted.load(Ordering::SeqCst) == 0 {
                let f = &mut frames[i + self.corrupt_at].0;
                let at = f.len() - TAG_LEN - 1; // the payload's last byte
                f[at] ^= 0x10;
                self.corrupted.fetch_add(1, Ordering::SeqCst);
            }
            let mut run = frames[i].0[..ETH_HEADER_LEN].to_vec();
            for (f, _) in &frames[i..end] {
                run.extend_from_slice(&f[ETH_HEADER_LEN..]);
            }
            for k in 0..end - i {
                let at = ETH_HEADER_LEN + k * unit;
                run[at - ETH_HEADER_LEN..at].copy_from_slice(&frames[i + k].0[..ETH_HEADER_LEN]);
                let (this, rest) = run.split_at_mut(at + unit);
                sink(&this[at - ETH_HEADER_LEN..], RxMeta { vouched: frames[i + k].1, ahead: Ahead { bytes: rest, stride: unit }, ..RxMeta::default() });
            }
            i = end;
        }
        Ok(n)
    }
}

/// A peer on its own thread that accepts one connection (discriminator
/// `disc`) to a reliable VI with one `len`-byte receive posted, and
/// receives one message; it stays connected until `end` is sent, then
/// answers what came and its engine's counters.
#[allow(dead_code)] // (each test binary uses some of this module)
pub struct OneMessage {
    pub mac: MacAddr,
    pub ready: mpsc::Receiver<()>,
    pub end: mpsc::Sender<()>,
    pub done: JoinHandle<(u32, Vec<u8>, Counters)>,
}

#[allow(dead_code)]
impl OneMessage {
    pub fn serve(server: Nic, disc: &'static [u8], len: usize, timeout: Duration) -> OneMessage {
        let mac = server.mac();
        let (ready_tx, ready) = mpsc::channel();
        let (end, end_rx) = mpsc::channel::<()>();
        let done = thread::spawn(move || {
            let ptag = server.create_ptag().unwrap();
            let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
            let mut vi = server.create_vi(&a, None, None).unwrap();
            let buf = MemoryRegion::new(&server, len, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
            let mut d = Descriptor::new(&server, ptag, 1).unwrap();
            d.set(&[(&buf, 0..len)], None).unwrap();
            vi.post_recv(d).unwrap();
            let req = server.connect_wait(disc, Some(timeout)).unwrap();
            server.accept(&req, &vi).unwrap();
            ready_tx.send(()).unwrap();
            let d = vi.recv_wait(Some(timeout)).unwrap();
            let got = (d.status(), buf.to_vec(0..d.length() as usize).unwrap(), server.counters());
            // Connected until the sender is done (a disconnect would end
            // its send early).
            let _ = end_rx.recv();
            got
        });
        OneMessage { mac, ready, end, done }
    }
}
