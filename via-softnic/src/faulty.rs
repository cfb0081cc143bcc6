//! [`FaultyDevice`]: any device with faults injected on transmit — frames
//! lost, duplicated, sent out of order or corrupted, at given rates from a
//! seeded generator — for testing loss recovery on real links where `tc
//! netem` is not available (this project's kernels lack it).
//!
//! Named `<device>?loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N` (rates
//! from 0 to 1, each optional). A reordered frame is held back and sent
//! after the next one (or at the next call, if it was the last of its
//! batch). A corrupted frame has one bit flipped past its MAC addresses
//! (which a NIC would deliver elsewhere or not at all); the device then
//! reports itself unchecksummed, as a link that corrupts frames is.
//!
//! With `delay=US` every frame that goes out waits that many microseconds
//! in a queue first (a long link). The frames go out when the device is
//! next called after their time; so that a caller sleeping on
//! [`FrameDevice::wait_fd`] is woken for them, the device's wait fd is then
//! an epoll set of the inner device's fd and a timerfd armed for the
//! earliest waiting frame.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};
use via_device::{Ahead, Capabilities, FrameDevice, MacAddr, Path, RxFilter, RxMeta, Sleep, TxFrame};

/// Fault rates, each the probability per transmitted frame.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
    /// Added one-way delay, microseconds.
    pub delay_us: u64,
    pub seed: u64,
}

impl Faults {
    /// Parses `loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N`.
    pub fn parse(spec: &str) -> io::Result<Faults> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("fault spec {spec:?}: {why}"));
        let mut f = Faults { seed: 1, ..Faults::default() };
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(format!("{kv:?} is not key=value")))?;
            if k == "seed" || k == "delay" {
                let n = v.parse().map_err(|_| bad(format!("{k} {v:?} is not a whole number")))?;
                if k == "seed" {
                    f.seed = n;
                } else if n > 10_000_000 {
                    return Err(bad(format!("delay={n}: at most 10000000 microseconds")));
                } else {
                    f.delay_us = n;
                }
                continue;
            }
            let p: f64 = v.parse().ok().filter(|p| (0.0..=1.0).contains(p)).ok_or_else(|| bad(format!("{k}={v}: want a rate from 0 to 1")))?;
            match k {
                "loss" => f.loss = p,
                "dup" => f.dup = p,
                "reorder" => f.reorder = p,
                "corrupt" => f.corrupt = p,
                _ => return Err(bad(format!("unknown fault {k:?} (loss, dup, reorder, corrupt, delay, seed)"))),
            }
        }
        Ok(f)
    }
}

/// A device that loses, duplicates, reorders, corrupts and delays what it
/// sends.
pub struct FaultyDevice {
    inner: Box<dyn FrameDevice>,
    faults: Faults,
    rng: u64,
    /// A frame held back to go after the next one.
    held: Option<Vec<u8>>,
    /// With a delay: frames waiting for their time, oldest first.
    delayed: VecDeque<(Instant, Vec<u8>)>,
    /// With a delay: the epoll set (inner fd + `timer`) callers wait on.
    wait_set: Option<(OwnedFd, OwnedFd)>,
    lost: u64,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
    delayed_frames: u64,
}

impl FaultyDevice {
    pub fn new(inner: Box<dyn FrameDevice>, faults: Faults) -> io::Result<FaultyDevice> {
        let wait_set = if faults.delay_us > 0 { Some(wait_set(inner.wait_fd())?) } else { None };
        Ok(FaultyDevice {
            inner,
            faults,
            rng: faults.seed.max(1),
            held: None,
            delayed: VecDeque::new(),
            wait_set,
            lost: 0,
            duplicated: 0,
            reordered: 0,
            corrupted: 0,
            delayed_frames: 0,
        })
    }

    /// True with probability `p` (xorshift64*).
    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// The generator's next number (xorshift64*).
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Puts one frame on the link: now, or with a delay, into the queue
    /// (which always has room). False if the device refused it.
    fn emit(&mut self, f: &TxFrame<'_>) -> io::Result<bool> {
        if self.faults.delay_us == 0 {
            return Ok(self.inner.transmit(std::slice::from_ref(f))? == 1);
        }
        let mut bytes = Vec::with_capacity(f.len());
        f.append_to(&mut bytes);
        self.delay(bytes)?;
        Ok(true)
    }

    /// Queues a frame to go out after the delay.
    fn delay(&mut self, bytes: Vec<u8>) -> io::Result<()> {
        let due = Instant::now() + Duration::from_micros(self.faults.delay_us);
        self.delayed_frames += 1;
        self.delayed.push_back((due, bytes));
        if self.delayed.len() == 1 {
            self.arm_timer(due)?;
        }
        Ok(())
    }

    /// Sends the delayed frames whose time has come (a frame the device
    /// refuses is lost), then arms the timer for the next one.
    fn release_due(&mut self) -> io::Result<()> {
        let Some((_, timer)) = &self.wait_set else { return Ok(()) };
        drain_timer(timer.as_raw_fd());
        let now = Instant::now();
        while self.delayed.front().is_some_and(|(due, _)| *due <= now) {
            let (_, bytes) = self.delayed.pop_front().unwrap();
            if self.inner.transmit(&[TxFrame::new(&bytes)])? == 0 {
                self.lost += 1;
            }
        }
        match self.delayed.front() {
            Some(&(due, _)) => self.arm_timer(due),
            None => Ok(()),
        }
    }

    /// Arms the wait set's timer to fire at `due` (at once if it has passed).
    fn arm_timer(&self, due: Instant) -> io::Result<()> {
        let Some((_, timer)) = &self.wait_set else { return Ok(()) };
        let left = due.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos() as libc::c_long },
        };
        // SAFETY: `timer` is an open timerfd; `spec` is a valid itimerspec.
        if unsafe { libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends the held-back frame, if any (dropped if refused: it counts as
    /// lost, which the faults allow).
    fn release_held(&mut self) -> io::Result<()> {
        if let Some(h) = self.held.take() {
            if !self.emit(&TxFrame::new(&h))? {
                self.lost += 1;
            }
        }
        Ok(())
    }
}

impl Drop for FaultyDevice {
    /// Frames on the link outlive their sender: what is still delayed goes
    /// out at its time (so a process's last frames, a Disconnect or the
    /// ACK of a final message, are not lost because it exited at once).
    fn drop(&mut self) {
        let _ = self.release_held();
        while let Some((due, bytes)) = self.delayed.pop_front() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            let _ = self.inner.transmit(&[TxFrame::new(&bytes)]);
        }
    }
}

/// An epoll set of `inner` and a new timerfd: (epoll fd, timerfd).
fn wait_set(inner: RawFd) -> io::Result<(OwnedFd, OwnedFd)> {
    let owned = |fd: i32| if fd < 0 { Err(io::Error::last_os_error()) } else { Ok(unsafe { OwnedFd::from_raw_fd(fd) }) };
    // SAFETY: plain syscalls creating new descriptors, owned at once.
    let ep = owned(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    let timer = owned(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) })?;
    for fd in [inner, timer.as_raw_fd()] {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((ep, timer))
}

/// Reads a timerfd's expiry count, so that it stops being readable.
fn drain_timer(timer: RawFd) {
    let mut n = 0u64;
    // SAFETY: reads 8 bytes into `n` from a non-blocking timerfd.
    unsafe { libc::read(timer, (&mut n as *mut u64).cast(), 8) };
}

impl FrameDevice for FaultyDevice {
    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    fn capabilities(&self) -> Capabilities {
        let c = self.inner.capabilities();
        Capabilities { checksummed: c.checksummed && self.faults.corrupt == 0.0, reorders: c.reorders || self.faults.reorder > 0.0, ..c }
    }

    fn wait_fd(&self) -> RawFd {
        match &self.wait_set {
            Some((ep, _)) => ep.as_raw_fd(),
            None => self.inner.wait_fd(),
        }
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        self.inner.set_filter(filter)
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        // A frame held back at the end of a batch goes out now at the latest.
        self.release_held()?;
        self.release_due()?;
        self.inner.receive(budget, sink)
    }

    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        self.release_held()?;
        self.release_due()?;
        // A link that corrupts vouches for nothing.
        let whole = self.faults.corrupt == 0.0;
        self.inner.receive_lent(budget, &mut |f, meta| sink(f, RxMeta { vouched: meta.vouched && whole, ahead: Ahead::default(), ..meta }))
    }

    fn serve_peers(&mut self) -> usize {
        self.inner.serve_peers()
    }

    fn path_to(&mut self, head: &[u8]) -> Path {
        let p = self.inner.path_to(head);
        Path { checksummed: p.checksummed && self.faults.corrupt == 0.0, ..p }
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        self.release_due()?;
        for (i, f) in frames.iter().enumerate() {
            if self.chance(self.faults.loss) {
                self.lost += 1;
                continue;
            }
            if self.held.is_none() && self.chance(self.faults.reorder) {
                self.reordered += 1;
                let mut held = Vec::new();
                f.append_to(&mut held);
                self.held = Some(held);
                continue;
            }
            if f.len() > 12 && self.chance(self.faults.corrupt) {
                let mut bytes = Vec::new();
                f.append_to(&mut bytes);
                let bit = (self.next() % ((bytes.len() as u64 - 12) * 8)) as usize;
                bytes[12 + bit / 8] ^= 1 << (bit % 8);
                if !self.emit(&TxFrame::new(&bytes))? {
                    return Ok(i);
                }
                self.corrupted += 1;
                self.release_held()?;
                continue;
            }
            if !self.emit(f)? {
                return Ok(i);
            }
            self.release_held()?;
            if self.chance(self.faults.dup) {
                self.duplicated += 1;
                self.emit(f)?;
            }
        }
        Ok(frames.len())
    }

    fn map_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.inner.map_memory(addr, len)
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.inner.unmap_memory(addr, len)
    }

    fn prepare_sleep(&mut self) -> Option<Sleep> {
        self.inner.prepare_sleep()
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let mut s = self.inner.stats();
        s.extend([("faults_lost", self.lost), ("faults_duplicated", self.duplicated), ("faults_reordered", self.reordered), ("faults_corrupted", self.corrupted), ("faults_delayed", self.delayed_frames)]);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoopbackDevice;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(Faults::parse("loss=0.05,dup=0.01,reorder=0.2,seed=9").unwrap(), Faults { loss: 0.05, dup: 0.01, reorder: 0.2, corrupt: 0.0, delay_us: 0, seed: 9 });
        assert_eq!(Faults::parse("").unwrap(), Faults { seed: 1, ..Faults::default() });
        for bad in ["loss=2", "loss", "corrupt=-1", "bits=0.1", "seed=x", "delay=0.5", "delay=99999999"] {
            let e = Faults::parse(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    /// A corrupted frame arrives with one bit flipped past its addresses;
    /// a device that corrupts says it cannot vouch for its frames.
    #[test]
    fn corruption_flips_one_bit_past_the_addresses() {
        let w = format!("faulty-c-{}", std::process::id());
        let mut rx = LoopbackDevice::open(&w).unwrap();
        let mut tx = FaultyDevice::new(Box::new(LoopbackDevice::open(&w).unwrap()), Faults { corrupt: 0.25, seed: 7, ..Faults::default() }).unwrap();
        assert!(!tx.capabilities().checksummed);
        let mut f = vec![0x5au8; 100];
        f[..6].copy_from_slice(&rx.mac().0);
        let (mut same, mut flipped) = (0, 0);
        for _ in 0..400 {
            assert_eq!(tx.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
            rx.receive(8, &mut |g| {
                let bits: u32 = f.iter().zip(g).map(|(a, b)| (a ^ b).count_ones()).sum();
                assert!(bits <= 1 && g[..12] == f[..12] && g.len() == f.len(), "one bit past the addresses");
                if bits == 0 { same += 1 } else { flipped += 1 }
            })
            .unwrap();
        }
        assert_eq!(same + flipped, 400);
        assert!((60..140).contains(&flipped), "{flipped} of 400 corrupted at 25 %");
        assert!(tx.stats().contains(&("faults_corrupted", flipped)));
    }

    /// The rates come out near what was asked, and with only reordering
    /// every frame still arrives once, a few out of order.
    #[test]
    fn faults_happen_at_their_rates() {
        let w = format!("faulty-{}", std::process::id());
        let frame = |dst: MacAddr, i: u32| {
            let mut f = vec![0u8; 64];
            f[..6].copy_from_slice(&dst.0);
            f[20..24].copy_from_slice(&i.to_be_bytes());
            f
        };
        let mut rx = LoopbackDevice::open(&w).unwrap();
        let mut tx = FaultyDevice::new(Box::new(LoopbackDevice::open(&w).unwrap()), Faults { loss: 0.1, dup: 0.05, seed: 3, ..Faults::default() }).unwrap();
        let mut got = 0;
        for i in 0..2000 {
            let f = frame(rx.mac(), i);
            assert_eq!(tx.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
            got += rx.receive(8, &mut |_| {}).unwrap();
        }
        // 2000 * 0.9 * 1.05 = 1890 expected.
        assert!((1800..1980).contains(&got), "{got} frames arrived");
        let mut tx = FaultyDevice::new(Box::new(LoopbackDevice::open(&w).unwrap()), Faults { reorder: 0.1, seed: 5, ..Faults::default() }).unwrap();
        let mut order = Vec::new();
        for i in 0..1000 {
            let f = frame(rx.mac(), i);
            assert_eq!(tx.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
            rx.receive(8, &mut |f| order.push(u32::from_be_bytes(f[20..24].try_into().unwrap()))).unwrap();
        }
        tx.receive(1, &mut |_| {}).unwrap(); // releases a frame still held
        rx.receive(8, &mut |f| order.push(u32::from_be_bytes(f[20..24].try_into().unwrap()))).unwrap();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>(), "every frame once");
        let swapped = order.windows(2).filter(|w| w[0] > w[1]).count();
        assert!((50..150).contains(&swapped), "{swapped} frames out of order");
    }

    /// A delayed frame does not arrive before its time; a caller sleeping
    /// on the device's wait fd is woken for it, and the next call sends it.
    #[test]
    fn delayed_frames_wake_the_waiter_and_go_out_after_the_delay() {
        let w = format!("faulty-d-{}", std::process::id());
        let mut rx = LoopbackDevice::open(&w).unwrap();
        let mut tx = FaultyDevice::new(Box::new(LoopbackDevice::open(&w).unwrap()), Faults { delay_us: 20_000, seed: 1, ..Faults::default() }).unwrap();
        let mut f = vec![0x11u8; 64];
        f[..6].copy_from_slice(&rx.mac().0);
        let t0 = Instant::now();
        assert_eq!(tx.transmit(&[TxFrame::new(&f)]).unwrap(), 1);
        assert_eq!(rx.receive(8, &mut |_| {}).unwrap(), 0, "not yet");
        let mut pfd = libc::pollfd { fd: tx.wait_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1, "the waiter is woken");
        tx.receive(8, &mut |_| {}).unwrap();
        let mut got = 0;
        rx.receive(8, &mut |g| {
            assert_eq!(g, &f[..]);
            got += 1;
        })
        .unwrap();
        assert_eq!(got, 1);
        assert!(t0.elapsed() >= Duration::from_micros(20_000), "arrived after {:?}", t0.elapsed());
        assert!(tx.stats().contains(&("faults_delayed", 1)));
        // Nothing waiting: the wait fd is quiet again.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 0) }, 0);
    }
}
