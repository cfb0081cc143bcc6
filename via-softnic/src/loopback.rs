//! An in-process loopback frame device for tests: every device opened with
//! the same wire name in one process hangs on one shared wire; a frame is
//! delivered to the device whose MAC it is addressed to (or to every other
//! device for broadcast), through that device's receive filter, into a
//! bounded queue. An eventfd per device makes `wait_fd` pollable.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use via_kernel_agent::{Capabilities, FrameDevice, MacAddr, RxFilter, TxFrame};

/// Frames a device queues before it drops (like a full ring).
pub const QUEUE_FRAMES: usize = 4096;

struct Port {
    mac: MacAddr,
    filter: Option<RxFilter>,
    queue: VecDeque<Vec<u8>>,
    free: Vec<Vec<u8>>,
    dropped: u64,
    efd: RawFd,
}

type Wire = Mutex<Vec<Weak<Mutex<Port>>>>;

fn wires() -> &'static Mutex<HashMap<String, Arc<Wire>>> {
    static W: OnceLock<Mutex<HashMap<String, Arc<Wire>>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

static NEXT_MAC: AtomicU32 = AtomicU32::new(1);

/// A device on an in-process wire.
pub struct LoopbackDevice {
    port: Arc<Mutex<Port>>,
    wire: Arc<Wire>,
    mac: MacAddr,
    mtu: usize,
    efd: RawFd,
    rx_frames: u64,
    tx_frames: u64,
    current: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn signal(efd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
    unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
}

fn drain(efd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a valid u64 from our nonblocking eventfd.
    unsafe { libc::read(efd, (&mut v as *mut u64).cast(), 8) };
}

impl LoopbackDevice {
    /// Attaches a new device with MTU 1500 to `wire`.
    pub fn open(wire: &str) -> io::Result<LoopbackDevice> {
        Self::with_mtu(wire, 1500)
    }

    pub fn with_mtu(wire: &str, mtu: usize) -> io::Result<LoopbackDevice> {
        // SAFETY: plain eventfd creation; the fd is owned by the device.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = NEXT_MAC.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let mac = MacAddr([0x02, 0x00, n[0] ^ (std::process::id() as u8), n[1], n[2], n[3]]);
        let port = Arc::new(Mutex::new(Port { mac, filter: None, queue: VecDeque::new(), free: Vec::new(), dropped: 0, efd }));
        let w = lock(wires()).entry(wire.to_string()).or_default().clone();
        lock(&w).push(Arc::downgrade(&port));
        Ok(LoopbackDevice { port, wire: w, mac, mtu, efd, rx_frames: 0, tx_frames: 0, current: Vec::new() })
    }
}

impl FrameDevice for LoopbackDevice {
    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: true, needs_pinning: false }
    }

    fn wait_fd(&self) -> RawFd {
        self.efd
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        let mut p = lock(&self.port);
        p.filter = Some(filter);
        p.queue.retain(|f| filter.matches(f));
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let frame = {
                let mut p = lock(&self.port);
                if let Some(old) = (!self.current.is_empty()).then(|| std::mem::take(&mut self.current)) {
                    p.free.push(old);
                }
                match p.queue.pop_front() {
                    Some(f) => f,
                    None => {
                        drain(self.efd);
                        if !p.queue.is_empty() {
                            signal(self.efd);
                        }
                        break;
                    }
                }
            };
            self.current = frame;
            sink(&self.current);
            n += 1;
        }
        self.rx_frames += n as u64;
        Ok(n)
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let ports: Vec<Arc<Mutex<Port>>> = {
            let mut w = lock(&self.wire);
            w.retain(|p| p.strong_count() > 0);
            w.iter().filter_map(Weak::upgrade).filter(|p| !Arc::ptr_eq(p, &self.port)).collect()
        };
        for f in frames {
            if f.len() > self.mtu + 14 {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("frame of {} bytes exceeds MTU {} + 14", f.len(), self.mtu)));
            }
            let dst = MacAddr(f.header.get(..6).and_then(|d| d.try_into().ok()).unwrap_or([0; 6]));
            for port in &ports {
                let mut p = lock(port);
                if !(dst.is_broadcast() || dst == p.mac) {
                    continue;
                }
                let mut buf = p.free.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(f.header);
                for piece in f.pieces() {
                    buf.extend_from_slice(piece);
                }
                if p.filter.is_some_and(|fl| !fl.matches(&buf)) {
                    p.free.push(buf);
                    continue;
                }
                if p.queue.len() >= QUEUE_FRAMES {
                    p.dropped += 1;
                    p.free.push(buf);
                    continue;
                }
                p.queue.push_back(buf);
                signal(p.efd);
            }
        }
        self.tx_frames += frames.len() as u64;
        Ok(frames.len())
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        vec![("rx_frames", self.rx_frames), ("tx_frames", self.tx_frames), ("rx_dropped_queue_full", lock(&self.port).dropped)]
    }
}

impl Drop for LoopbackDevice {
    fn drop(&mut self) {
        lock(&self.wire).retain(|p| p.strong_count() > 0 && !std::ptr::eq(p.as_ptr(), Arc::as_ptr(&self.port)));
        // SAFETY: closing the eventfd this device created and owns.
        unsafe { libc::close(self.efd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: MacAddr, ep: u32) -> Vec<u8> {
        let mut f = vec![0u8; 30];
        f[..6].copy_from_slice(&dst.0);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f[18..22].copy_from_slice(&ep.to_be_bytes());
        f
    }

    fn recv_all(d: &mut LoopbackDevice) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        d.receive(100, &mut |f| v.push(f.to_vec())).unwrap();
        v
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn delivers_by_mac_and_filter() {
        let mut a = LoopbackDevice::open("t1").unwrap();
        let mut b = LoopbackDevice::open("t1").unwrap();
        let mut c = LoopbackDevice::open("t1").unwrap();
        b.set_filter(RxFilter { ethertype: 0x88b5, offset: 18, accept: [7, 0] }).unwrap();
        let f1 = frame(b.mac(), 7);
        let f2 = frame(b.mac(), 8); // filtered out
        let f3 = frame(MacAddr::BROADCAST, 0);
        for f in [&f1, &f2, &f3] {
            a.transmit(&[TxFrame::new(f)]).unwrap();
        }
        assert!(readable(b.wait_fd()));
        assert_eq!(recv_all(&mut b), vec![f1.clone(), f3.clone()]);
        assert!(!readable(b.wait_fd()));
        assert_eq!(recv_all(&mut c), vec![f3.clone()]);
        assert!(recv_all(&mut a).is_empty(), "no self-delivery");
    }

    #[test]
    fn gathers_and_bounds_the_queue() {
        let mut a = LoopbackDevice::open("t2").unwrap();
        let mut b = LoopbackDevice::open("t2").unwrap();
        let h = frame(b.mac(), 1);
        let mut t = TxFrame::new(&h);
        t.push(b"abc");
        t.push(b"de");
        a.transmit(&[t]).unwrap();
        let got = recv_all(&mut b);
        assert_eq!(&got[0][30..], b"abcde");
        let many: Vec<_> = (0..QUEUE_FRAMES + 5).map(|_| TxFrame::new(&h)).collect();
        a.transmit(&many).unwrap();
        let mut n = 0;
        while b.receive(1000, &mut |_| n += 1).unwrap() > 0 {}
        assert_eq!(n, QUEUE_FRAMES);
        assert_eq!(b.stats()[2].1, 5);
        let big = vec![0u8; 1515];
        assert_eq!(a.transmit(&[TxFrame::new(&big)]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
