//! CPU cost of the engine per message, without the kernel: two NICs in one
//! thread joined by a queue device (no system call), a ping-pong of 64-byte
//! messages through the full Rust API. Run: `cargo bench -p via-user
//! --bench engine_cost`; under `valgrind --tool=callgrind` it gives the
//! instruction count of the post/complete path.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use via_kernel_agent::{Capabilities, FrameDevice, MacAddr, RxFilter, TxFrame};
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, ViAttributes};

type Wire = Arc<Mutex<VecDeque<Vec<u8>>>>;

/// Frames written to `tx` are read from the peer's `rx`.
struct QueueDevice {
    mac: MacAddr,
    rx: Wire,
    tx: Wire,
    cur: Vec<u8>,
}

impl FrameDevice for QueueDevice {
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
        -1
    }
    fn set_filter(&mut self, _: RxFilter) -> io::Result<()> {
        Ok(())
    }
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.rx.lock().unwrap().pop_front() else { break };
            self.cur = f;
            sink(&self.cur);
            n += 1;
        }
        Ok(n)
    }
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let mut q = self.tx.lock().unwrap();
        for f in frames {
            let mut b = Vec::with_capacity(f.len());
            b.extend_from_slice(f.header);
            for p in f.pieces() {
                b.extend_from_slice(p);
            }
            q.push_back(b);
        }
        Ok(frames.len())
    }
}

fn main() {
    let (ab, ba): (Wire, Wire) = Default::default();
    // The queue device has no fd to sleep on: waits spin throughout.
    let cfg = Config { progress_thread: false, spin: Duration::from_secs(60), ..Config::default() };
    let a = Nic::with_device("a", Box::new(QueueDevice { mac: MacAddr([2, 0, 0, 0, 0, 1]), rx: ba.clone(), tx: ab.clone(), cur: Vec::new() }), cfg.clone()).unwrap();
    let b = Nic::with_device("b", Box::new(QueueDevice { mac: MacAddr([2, 0, 0, 0, 0, 2]), rx: ab, tx: ba, cur: Vec::new() }), cfg).unwrap();
    let setup = |nic: &Nic| {
        let ptag = nic.create_ptag().unwrap();
        let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: false };
        let vi = nic.create_vi(&attrs, None, None).unwrap();
        let mem = MemoryRegion::new(nic, 8192, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        let mk = |r: std::ops::Range<usize>| {
            let mut d = Descriptor::new(nic, ptag, 1).unwrap();
            d.set(&[(&mem, r)], None).unwrap();
            d
        };
        let sends: Vec<Descriptor> = (0..16).map(|_| mk(0..64)).collect();
        let recv = mk(4096..8192);
        (vi, mem.clone(), sends, recv)
    };
    let (mut va, _ma, mut sa, ra) = setup(&a);
    let (mut vb, _mb, mut sb, rb) = setup(&b);
    vb.post_recv(rb).unwrap();
    va.post_recv(ra).unwrap();
    let bmac = b.mac();
    // Connect: the server's wait must run while the client's request is in flight.
    let b2 = b.clone();
    let server = std::thread::spawn(move || {
        let req = b2.connect_wait(b"bench", Some(Duration::from_secs(5))).unwrap();
        (req, b2)
    });
    let client = std::thread::spawn(move || {
        va.connect_retrying(bmac, b"bench", Duration::from_secs(5)).unwrap();
        va
    });
    let (req, b2) = server.join().unwrap();
    b2.accept(&req, &vb).unwrap();
    let mut va = client.join().unwrap();

    let iters = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000u32);
    let t0 = Instant::now();
    // Sends complete when the peer's next message acknowledges them, so
    // each side keeps a few send descriptors and reaps what completed.
    for _ in 0..iters {
        va.post_send(sa.pop().expect("send descriptors")).unwrap();
        let r = vb.recv_wait(None).unwrap();
        vb.post_send(sb.pop().expect("send descriptors")).unwrap();
        vb.post_recv(r).unwrap();
        let r = va.recv_wait(None).unwrap();
        va.post_recv(r).unwrap();
        while let Some(d) = va.send_done().unwrap() {
            sa.push(d);
        }
        while let Some(d) = vb.send_done().unwrap() {
            sb.push(d);
        }
    }
    let per = t0.elapsed() / iters / 2;
    println!("engine cost per one-way 64 B message (both ends, no kernel): {per:?}");
}
