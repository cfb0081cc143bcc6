//! Tags checked four at a time on receipt: a superframe's units come to
//! the engine with the rest of the superframe behind them
//! (`via_device::Ahead`), and the engine checks a unit's tag together
//! with the next three's and keeps their verdicts. A unit whose bytes
//! were changed on the way must still be refused, alone, wherever it lies
//! in its four, and the message must still arrive whole (sent again).
//! Over the in-process loopback device, behind a wrapper that hands its
//! frames on as the UDP packet device hands a superframe's units. (Alone
//! in its test binary: it sets VIA_SECRET.)

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;
use via_device::{Ahead, Capabilities, FrameDevice, MacAddr, RxFilter, RxMeta, Sleep, TxFrame};
use via_user::descriptor::status;
use via_user::{Config, Descriptor, MemAttributes, MemoryRegion, Nic, Reliability, ViAttributes};
use via_wire::{Kind, ETH_HEADER_LEN, TAG_LEN};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

const T: Option<Duration> = Some(Duration::from_secs(10));

/// `inner`'s received frames handed on as a superframe's units: each run
/// of frames of one length laid end to end in one buffer (VIA header
/// onward), each handed with the rest of its run as [`Ahead`] and its
/// Ethernet header written over the tail of the unit before (handed on
/// already), as `via_softnic`'s packet device does. The first time a run
/// of at least four data frames comes, the payload of its unit at
/// `corrupt_at` (< 4) has a bit flipped (counted in `corrupted`).
struct Superframing {
    inner: Box<dyn FrameDevice>,
    corrupt_at: usize,
    corrupted: Arc<AtomicUsize>,
}

impl FrameDevice for Superframing {
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

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29) ^ (i >> 9) as u8).collect()
}

/// Sends one 100-fragment message to a receiver whose device flips a bit
/// in the unit at `corrupt_at` of the first long run of data frames;
/// returns the receiver's counters.
fn one_corrupted_unit(corrupt_at: usize) -> via_user::Counters {
    let len = 100 * 1400;
    let corrupted = Arc::new(AtomicUsize::new(0));
    let wire = format!("loop:ahead-{corrupt_at}");
    let inner = via_device::open_device(&wire, &[]).unwrap();
    let dev = Superframing { inner, corrupt_at, corrupted: corrupted.clone() };
    let server = Nic::with_device("ahead", Box::new(dev), Config::default()).unwrap();
    let smac = server.mac();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let target = thread::spawn(move || {
        let ptag = server.create_ptag().unwrap();
        let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
        let mut vi = server.create_vi(&a, None, None).unwrap();
        let buf = MemoryRegion::new(&server, len, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
        let mut d = Descriptor::new(&server, ptag, 1).unwrap();
        d.set(&[(&buf, 0..len)], None).unwrap();
        vi.post_recv(d).unwrap();
        let req = server.connect_wait(b"ahead", T).unwrap();
        server.accept(&req, &vi).unwrap();
        ready_tx.send(()).unwrap();
        let d = vi.recv_wait(T).unwrap();
        let got = (d.status(), buf.to_vec(0..d.length() as usize).unwrap(), server.counters());
        // Connected until the sender's send completed.
        let _ = end_rx.recv();
        got
    });
    let client = Nic::with_device("ahead", via_device::open_device(&wire, &[]).unwrap(), Config::default()).unwrap();
    let ptag = client.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let mut vi = client.create_vi(&a, None, None).unwrap();
    let msg = data(len);
    let buf = MemoryRegion::new(&client, len, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    buf.write(0, &msg).unwrap();
    vi.connect_retrying(smac, b"ahead", T.unwrap()).unwrap();
    ready_rx.recv().unwrap();
    let mut d = Descriptor::new(&client, ptag, 1).unwrap();
    d.set(&[(&buf, 0..len)], None).unwrap();
    vi.post_send(d).unwrap();
    let sent = vi.send_wait(T).unwrap();
    assert_eq!(sent.errors(), 0, "the send: status {:#x}", sent.status());
    end_tx.send(()).unwrap();
    let (st, got, counters) = target.join().unwrap();
    assert_eq!(st & status::DONE, status::DONE);
    assert_eq!(got.len(), len);
    assert!(got == msg, "the message arrived whole (unit {corrupt_at} of its run corrupted)");
    assert_eq!(corrupted.load(Ordering::SeqCst), 1, "one unit was corrupted");
    counters
}

#[test]
fn a_unit_changed_on_the_way_is_refused_wherever_it_lies_in_its_four() {
    let dir = std::env::temp_dir().join(format!("via-tags-ahead-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let secret = dir.join("secret");
    via_kernel_agent::auth::create_secret_file(&secret).unwrap();
    // SAFETY (edition 2021: safe): this binary's only test, before any
    // engine opens.
    std::env::set_var("VIA_SECRET", &secret);
    let lanes = via_wire::tag_lanes::lanes_available();
    // Each position of a four: its first (checked with the three after
    // it), and the three checked ahead.
    for at in 0..4 {
        let c = one_corrupted_unit(at);
        assert_eq!(c.rx_bad_auth, 1, "unit {at}: the changed unit alone is refused: {c:?}");
        assert!(c.rx_authenticated >= 100, "unit {at}: {c:?}");
        if lanes {
            // The run's first four were checked together (how many more
            // were depends on how the receiver's polls cut the stream).
            assert!(c.rx_checked_ahead >= 3, "unit {at}: units' tags checked ahead: {c:?}");
        } else {
            eprintln!("no AVX-512 with VAES here: each tag is checked alone");
            assert_eq!(c.rx_checked_ahead, 0, "{c:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
