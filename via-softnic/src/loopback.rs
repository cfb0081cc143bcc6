//! [`LoopbackDevice`]: an in-process frame device for tests. It owns the
//! process-wide table of named wires: every device opened with the same wire
//! name hangs on one wire, and a frame goes to the other device whose MAC it
//! is addressed to (or to every other device for broadcast), through that
//! device's receive filter, into its bounded queue. An eventfd per device
//! makes `wait_fd` pollable.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use via_device::ETH_HEADER_LEN;
use via_device::{Capabilities, EventFd, FrameDevice, MacAddr, RxFilter, TxFrame};

/// Frames a device queues before it drops more (like a full ring).
pub const QUEUE_FRAMES: usize = 4096;

/// The receiving half of a device, shared with the wire.
struct Port {
    mac: MacAddr,
    efd: EventFd,
    rx: Mutex<RxQueue>,
    /// Receives every frame on the wire, whatever its destination (a tap
    /// for tests: [`LoopbackDevice::set_promiscuous`]).
    promiscuous: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct RxQueue {
    filter: Option<RxFilter>,
    frames: VecDeque<Vec<u8>>,
    /// Buffers of frames already received, reused for new ones.
    free: Vec<Vec<u8>>,
    dropped_full: u64,
    filtered: u64,
}

/// The devices attached to one wire.
type Wire = Mutex<Vec<Arc<Port>>>;

fn wires() -> &'static Mutex<HashMap<String, Arc<Wire>>> {
    static WIRES: OnceLock<Mutex<HashMap<String, Arc<Wire>>>> = OnceLock::new();
    WIRES.get_or_init(Default::default)
}

static NEXT_MAC: AtomicU32 = AtomicU32::new(1);

/// Locks, shrugging off poisoning: every critical section leaves its data
/// consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A device on an in-process wire.
pub struct LoopbackDevice {
    port: Arc<Port>,
    wire_name: String,
    wire: Arc<Wire>,
    mtu: usize,
    /// The frame handed to the last `receive` sink, kept for reuse.
    current: Vec<u8>,
    /// The other ports of the wire, gathered per transmit (kept for reuse).
    peers: Vec<Arc<Port>>,
    rx_frames: u64,
    tx_frames: u64,
    tx_oversize: u64,
}

impl std::fmt::Debug for LoopbackDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackDevice").field("wire", &self.wire_name).field("mac", &self.port.mac).field("mtu", &self.mtu).finish_non_exhaustive()
    }
}

impl LoopbackDevice {
    /// Makes this device receive every frame sent on its wire, whatever
    /// its destination (as a tap does; its filter still applies).
    pub fn set_promiscuous(&mut self, on: bool) {
        self.port.promiscuous.store(on, Ordering::Relaxed);
    }

    /// Attaches a new device with MTU 1500 to the wire called `wire`.
    pub fn open(wire: &str) -> io::Result<LoopbackDevice> {
        Self::with_mtu(wire, 1500)
    }

    /// Attaches a new device with the given MTU to the wire called `wire`.
    /// Its MAC is 02:00:00:xx:xx:xx, unique in the process.
    pub fn with_mtu(wire: &str, mtu: usize) -> io::Result<LoopbackDevice> {
        let efd = EventFd::new()?;
        let n = NEXT_MAC.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        let mac = MacAddr([0x02, 0x00, 0x00, n[1], n[2], n[3]]);
        let port = Arc::new(Port { mac, efd, rx: Mutex::default(), promiscuous: Default::default() });
        // Attach under the table lock, so that a wire is never dropped from
        // the table while a device is joining it.
        let wire_arc = {
            let mut table = lock(wires());
            let w = table.entry(wire.to_string()).or_default().clone();
            lock(&w).push(port.clone());
            w
        };
        Ok(LoopbackDevice { port, wire_name: wire.to_string(), wire: wire_arc, mtu, current: Vec::new(), peers: Vec::new(), rx_frames: 0, tx_frames: 0, tx_oversize: 0 })
    }

    /// The name of the wire this device is attached to.
    pub fn wire_name(&self) -> &str {
        &self.wire_name
    }
}

impl Port {
    /// Queues a copy of `f` if it is for us and passes our filter.
    fn deliver(&self, dst: MacAddr, f: &TxFrame<'_>) {
        if !(dst.is_broadcast() || dst == self.mac || self.promiscuous.load(Ordering::Relaxed)) {
            return;
        }
        let mut q = lock(&self.rx);
        if q.frames.len() >= QUEUE_FRAMES {
            q.dropped_full += 1;
            return;
        }
        let mut buf = q.free.pop().unwrap_or_default();
        buf.clear();
        f.append_to(&mut buf);
        if q.filter.is_some_and(|fl| !fl.matches(&buf)) {
            q.filtered += 1;
            q.free.push(buf);
            return;
        }
        q.frames.push_back(buf);
        // Signalled under the queue lock, so it cannot race with the drain
        // in `receive`.
        self.efd.signal();
    }
}

/// The first six bytes of the frame, wherever the header split it.
fn dst_mac(f: &TxFrame<'_>) -> MacAddr {
    let mut d = [0u8; 6];
    f.prefix(&mut d);
    MacAddr(d)
}

impl FrameDevice for LoopbackDevice {
    fn mac(&self) -> MacAddr {
        self.port.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: true, needs_pinning: false, reorders: false, serves_peers: false }
    }

    fn wait_fd(&self) -> RawFd {
        self.port.efd.as_raw_fd()
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        let mut q = lock(&self.port.rx);
        q.filter = Some(filter);
        // Frames queued before the filter went in must not get through.
        let RxQueue { frames, free, filtered, .. } = &mut *q;
        let before = frames.len();
        frames.retain_mut(|f| filter.matches(f) || {
            free.push(std::mem::take(f));
            false
        });
        *filtered += (before - frames.len()) as u64;
        if frames.is_empty() {
            self.port.efd.drain();
        }
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            {
                let mut q = lock(&self.port.rx);
                if !self.current.is_empty() && q.free.len() < QUEUE_FRAMES {
                    q.free.push(std::mem::take(&mut self.current));
                }
                match q.frames.pop_front() {
                    Some(f) => self.current = f,
                    None => break,
                }
                if q.frames.is_empty() {
                    self.port.efd.drain();
                }
            }
            sink(&self.current);
            n += 1;
        }
        self.rx_frames += n as u64;
        Ok(n)
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        let max = ETH_HEADER_LEN + self.mtu;
        for (i, f) in frames.iter().enumerate() {
            let len = f.len();
            if len > max || len < ETH_HEADER_LEN {
                self.tx_oversize += u64::from(len > max);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("frame {i} of the batch is {len} bytes; loopback wire {:?} takes {ETH_HEADER_LEN}..={max} (MTU {} + {ETH_HEADER_LEN})", self.wire_name, self.mtu),
                ));
            }
        }
        self.peers.clear();
        self.peers.extend(lock(&self.wire).iter().filter(|p| !Arc::ptr_eq(p, &self.port)).cloned());
        for f in frames {
            let dst = dst_mac(f);
            for p in &self.peers {
                p.deliver(dst, f);
            }
        }
        self.peers.clear();
        self.tx_frames += frames.len() as u64;
        Ok(frames.len())
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let q = lock(&self.port.rx);
        vec![
            ("rx_frames", self.rx_frames),
            ("tx_frames", self.tx_frames),
            ("rx_dropped_queue_full", q.dropped_full),
            ("rx_filtered", q.filtered),
            ("tx_oversize", self.tx_oversize),
        ]
    }
}

impl Drop for LoopbackDevice {
    fn drop(&mut self) {
        let mut table = lock(wires());
        let mut w = lock(&self.wire);
        w.retain(|p| !Arc::ptr_eq(p, &self.port));
        if w.is_empty() {
            drop(w);
            if table.get(&self.wire_name).is_some_and(|x| Arc::ptr_eq(x, &self.wire)) {
                table.remove(&self.wire_name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: usize = 18;

    fn frame(dst: MacAddr, ep: u32) -> Vec<u8> {
        let mut f = vec![0u8; 30];
        f[..6].copy_from_slice(&dst.0);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f[EP..EP + 4].copy_from_slice(&ep.to_be_bytes());
        f
    }

    fn send(d: &mut LoopbackDevice, f: &[u8]) {
        assert_eq!(d.transmit(&[TxFrame::new(f)]).unwrap(), 1);
    }

    fn recv_all(d: &mut LoopbackDevice) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while d.receive(7, &mut |f| v.push(f.to_vec())).unwrap() > 0 {}
        v
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn stat(d: &LoopbackDevice, name: &str) -> u64 {
        d.stats().into_iter().find(|s| s.0 == name).unwrap().1
    }

    #[test]
    fn delivers_by_mac_only_to_others() {
        let mut a = LoopbackDevice::open("mac").unwrap();
        let mut b = LoopbackDevice::open("mac").unwrap();
        let mut c = LoopbackDevice::open("mac").unwrap();
        assert!(a.mac() != b.mac() && b.mac() != c.mac() && a.mac() != c.mac());
        assert_eq!(a.mac().0[..3], [2, 0, 0]);
        assert_eq!(a.mtu(), 1500);
        let to_b = frame(b.mac(), 1);
        send(&mut a, &to_b);
        assert_eq!(recv_all(&mut b), vec![to_b.clone()]);
        assert!(recv_all(&mut c).is_empty());
        // A tap sees what is for others, but not what it sends itself.
        c.set_promiscuous(true);
        send(&mut a, &to_b);
        assert_eq!((recv_all(&mut b), recv_all(&mut c)), (vec![to_b.clone()], vec![to_b.clone()]));
        send(&mut c, &to_b);
        assert!(recv_all(&mut c).is_empty());
        assert_eq!(recv_all(&mut b).len(), 1);
        c.set_promiscuous(false);
        // Addressed to ourselves: the wire does not loop it back.
        let to_self = frame(a.mac(), 1);
        send(&mut a, &to_self);
        assert!(recv_all(&mut a).is_empty());
        // Another wire sees nothing.
        let mut other = LoopbackDevice::open("mac-other").unwrap();
        send(&mut a, &frame(MacAddr::BROADCAST, 1));
        assert!(recv_all(&mut other).is_empty());
        assert_eq!(recv_all(&mut b).len(), 1);
    }

    #[test]
    fn broadcast_reaches_every_other_device() {
        let mut d: Vec<_> = (0..4).map(|_| LoopbackDevice::open("bcast").unwrap()).collect();
        let f = frame(MacAddr::BROADCAST, 3);
        send(&mut d[1], &f);
        for (i, dev) in d.iter_mut().enumerate() {
            assert_eq!(recv_all(dev).len(), usize::from(i != 1), "device {i}");
        }
    }

    #[test]
    fn filter_applies_at_delivery_and_to_what_is_queued() {
        let mut a = LoopbackDevice::open("filter").unwrap();
        let mut b = LoopbackDevice::open("filter").unwrap();
        send(&mut a, &frame(b.mac(), 9)); // queued before the filter
        b.set_filter(RxFilter { ethertype: 0x88b5, offset: EP, accept: [7, 0] }).unwrap();
        let f7 = frame(b.mac(), 7);
        let f0 = frame(MacAddr::BROADCAST, 0);
        let mut other_type = frame(b.mac(), 7);
        other_type[13] = 0xb6;
        for f in [&f7, &frame(b.mac(), 8), &other_type, &f0] {
            send(&mut a, f);
        }
        assert_eq!(recv_all(&mut b), vec![f7, f0]);
        assert_eq!(stat(&b, "rx_filtered"), 3);
    }

    #[test]
    fn eventfd_is_readable_while_frames_wait() {
        let mut a = LoopbackDevice::open("efd").unwrap();
        let mut b = LoopbackDevice::open("efd").unwrap();
        assert!(!readable(b.wait_fd()));
        let f = frame(b.mac(), 1);
        send(&mut a, &f);
        send(&mut a, &f);
        assert!(readable(b.wait_fd()));
        assert_eq!(b.receive(1, &mut |_| {}).unwrap(), 1);
        assert!(readable(b.wait_fd()), "one frame still waits");
        assert_eq!(b.receive(1, &mut |_| {}).unwrap(), 1);
        assert!(!readable(b.wait_fd()), "drained with the queue");
        assert_eq!(b.receive(1, &mut |_| {}).unwrap(), 0);
        assert_eq!(b.receive(0, &mut |_| {}).unwrap(), 0);
    }

    #[test]
    fn gathers_bounds_the_queue_and_refuses_oversize() {
        let mut a = LoopbackDevice::open("queue").unwrap();
        let mut b = LoopbackDevice::open("queue").unwrap();
        let h = frame(b.mac(), 1);
        let mut t = TxFrame::new(&h);
        t.push(b"abc");
        t.push(b"de");
        assert_eq!(a.transmit(&[t]).unwrap(), 1);
        assert_eq!(&recv_all(&mut b)[0][30..], b"abcde");

        let many: Vec<_> = (0..QUEUE_FRAMES + 5).map(|_| TxFrame::new(&h)).collect();
        assert_eq!(a.transmit(&many).unwrap(), many.len());
        assert_eq!(recv_all(&mut b).len(), QUEUE_FRAMES);
        assert_eq!(stat(&b, "rx_dropped_queue_full"), 5);

        let full = vec![0u8; 1514];
        let big = vec![0u8; 1515];
        let e = a.transmit(&[TxFrame::new(&full), TxFrame::new(&big)]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("1515"), "{e}");
        assert_eq!(stat(&a, "tx_oversize"), 1);
        assert!(recv_all(&mut b).is_empty(), "nothing of a refused batch goes out");
        let mut j = LoopbackDevice::with_mtu("queue", 9000).unwrap();
        assert_eq!(j.transmit(&[TxFrame::new(&[0u8; 9014])]).unwrap(), 1);
    }

    #[test]
    fn detaches_on_drop_and_works_across_threads() {
        let a = LoopbackDevice::open("threads").unwrap();
        let mut b = LoopbackDevice::open("threads").unwrap();
        let dst = b.mac();
        let t = std::thread::spawn(move || {
            let mut a = a;
            for i in 0..100u32 {
                send(&mut a, &frame(dst, i));
            }
        });
        t.join().unwrap();
        assert_eq!(recv_all(&mut b).len(), 100);
        drop(b);
        assert!(!lock(wires()).contains_key("threads"), "the last device took its wire along");
    }
}
