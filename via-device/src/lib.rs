//! The frame-device trait that NIC drivers implement, and opening a device
//! by its VIA name: all a driver depends on.
//!
//! Besides the trait ([`FrameDevice`], [`TxFrame`], [`RxFilter`],
//! [`LentPayload`]) and the opener table ([`registry`]: drivers register themselves,
//! [`open_device`] asks them in turn):
//! [`EventFd`], the descriptor a device makes readable when frames wait;
//! [`pci`], network PCI functions as sysfs lists them (for drivers that
//! find their NICs there); [`memlock`], explaining a pin of DMA memory
//! that `RLIMIT_MEMLOCK` refused; [`watch`], the words in a device's
//! receive ring that a spinning wait watches between rounds of progress;
//! and [`probe`], time-stamp marks along a reply's path, built only with
//! the `probe` feature (`scripts/turnaround.sh`).
//!
//! The trait is deliberately narrow (in the spirit of smoltcp's `phy::Device`
//! and ixy.rs's `rx_batch`/`tx_batch`):
//! - receive hands out frames in batches as borrowed views into the device's
//!   own ring; a frame is released when the callback returns, so nothing is
//!   allocated or copied per frame on the way in;
//! - transmit takes a batch of frames, each gathered from a header buffer and
//!   up to [`MAX_GATHER`] payload pieces (registered user memory), and rings
//!   the device's doorbell once for the whole batch;
//! - the device tells its MAC, MTU, capabilities and a file descriptor that
//!   becomes readable when frames arrive, so that waits can sleep.
//!
//! Between processes of one host a device may carry a frame's payload by
//! reference instead of by copy ([`LentPayload`]): the sender marks frames
//! whose payload stays put until acknowledged ([`TxFrame::lendable`]), the
//! device hands the receiver the sender's addresses, and the receiver
//! copies the bytes once, straight into their destination.

pub mod boxed;
pub mod eventfd;
pub mod memlock;
pub mod pci;
pub mod probe;
pub mod registry;
pub mod shared_copy;
pub mod watch;

pub use boxed::{BoxRepr, BoxRoute, BoxTemplate, BoxView, PlacedWord, BOX_HEADER_LEN};
pub use eventfd::EventFd;
pub use registry::{drivers, open_device, DeviceOpener, Driver, HostRoute, DRIVERS};
pub use shared_copy::{SharedCopy, SharedCopyRef};
pub use watch::{RxWatch, RxWatches};

#[doc(hidden)]
pub use linkme;

/// The Ethernet facts a driver needs: addresses, the header's length and
/// VIA's EtherType (what its receive filter matches).
pub use via_wire::{MacAddr, DST_EP_OFFSET, ETHERTYPE, ETH_HEADER_LEN, VIA_UDP_PORT};
use std::io;
use std::os::fd::RawFd;

/// Payload pieces one transmitted frame may gather, besides its header.
pub const MAX_GATHER: usize = 4;

/// What a device can do beyond moving frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Frames are checked by the hardware (Ethernet FCS) before delivery.
    pub checksummed: bool,
    /// The device DMAs from registered memory, so registration must pin
    /// pages and map them for the device.
    pub needs_pinning: bool,
    /// Frames to one destination may arrive out of order (a composite
    /// striping over several NICs): a receiver that finds a gap waits a
    /// moment for it to fill before it calls it a loss.
    pub reorders: bool,
    /// The device does work for its peers between frames
    /// ([`FrameDevice::serve_peers`]): the engine asks it every round.
    pub serves_peers: bool,
}

/// One frame to transmit: `header` (Ethernet + VIA header, built by the
/// engine) followed by the `payload` pieces, in order.
#[derive(Clone, Copy, Debug)]
pub struct TxFrame<'a> {
    pub header: &'a [u8],
    pub payload: [&'a [u8]; MAX_GATHER],
    /// How many entries of `payload` are used.
    pub pieces: usize,
    /// The payload pieces are registered memory that stays in place until
    /// the peer has the payload: a reliable VI's send or RDMA write (kept
    /// until acknowledged, and the receiver places a payload before it
    /// acknowledges it) or an RDMA read response (memory the requester is
    /// reading). A device between processes of one host may lend the
    /// pieces (send their addresses) instead of copying them.
    pub lendable: bool,
}

impl<'a> TxFrame<'a> {
    pub fn new(header: &'a [u8]) -> Self {
        TxFrame { header, payload: [&[]; MAX_GATHER], pieces: 0, lendable: false }
    }

    /// The payload's length (the frame without its header).
    pub fn payload_len(&self) -> usize {
        self.pieces().iter().map(|p| p.len()).sum()
    }

    /// Appends a payload piece; returns false (and adds nothing) when the
    /// frame already gathers [`MAX_GATHER`] pieces.
    pub fn push(&mut self, piece: &'a [u8]) -> bool {
        if self.pieces == MAX_GATHER {
            return false;
        }
        self.payload[self.pieces] = piece;
        self.pieces += 1;
        true
    }

    pub fn pieces(&self) -> &[&'a [u8]] {
        &self.payload[..self.pieces]
    }

    /// The header, then the payload pieces: the frame's bytes in order.
    fn parts(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        std::iter::once(self.header).chain(self.pieces().iter().copied())
    }

    /// Copies the frame's first bytes (as many as `out` holds, or the
    /// whole frame if shorter) into `out`; returns how many.
    pub fn prefix(&self, out: &mut [u8]) -> usize {
        let mut n = 0;
        for piece in self.parts() {
            let k = piece.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&piece[..k]);
            n += k;
        }
        n
    }

    /// The frame's first bytes (as many as `copy` holds, or the whole
    /// frame if shorter): read in place from the header when it holds
    /// them (every frame the engine builds), else copied into `copy`.
    #[inline]
    pub fn start<'s>(&'s self, copy: &'s mut [u8]) -> &'s [u8] {
        if self.header.len() >= copy.len() {
            return &self.header[..copy.len()];
        }
        let n = self.prefix(copy);
        &copy[..n]
    }

    /// Appends the whole frame (header, then the pieces) to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len());
        self.parts().for_each(|p| out.extend_from_slice(p));
    }

    /// Copies the whole frame to `dst`, which must hold [`TxFrame::len`]
    /// bytes.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `self.len()` bytes and not
    /// overlap the frame's pieces.
    pub unsafe fn copy_to(&self, dst: *mut u8) {
        let mut at = 0;
        for piece in self.parts() {
            // SAFETY: the caller vouches for `dst`; `at + piece.len()`
            // stays within `self.len()`.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), dst.add(at), piece.len()) };
            at += piece.len();
        }
    }

    /// Total length on the wire (without FCS).
    pub fn len(&self) -> usize {
        self.header.len() + self.payload_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The way a device reaches a destination ([`FrameDevice::path_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    /// The largest Ethernet payload.
    pub mtu: usize,
    /// Frames cannot be corrupted on the way (the hardware checks an FCS,
    /// or the path is memory): they need no checksum of their own.
    pub checksummed: bool,
    /// `mtu` holds at the far end too (a shared-memory wire: one segment,
    /// one slot size). Otherwise it is this end's alone, and the far end
    /// may take less (a segment whose ends were given different MTUs): the
    /// engine sends at most what the peer said it takes when they
    /// connected.
    pub both_ends: bool,
    /// The device lends every lendable payload ([`TxFrame::lendable`]) of
    /// at least this many bytes (it sends the headers and the pieces'
    /// addresses; the receiver reads the payload with one system call), so
    /// such a frame is not bound by `mtu`: a message may go whole, as one
    /// frame. None: it lends nothing, or not for certain.
    pub lends_from: Option<usize>,
}

/// What a device says of a received frame besides its bytes
/// ([`FrameDevice::receive_lent`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct RxMeta<'a> {
    /// Its payload, lent by a sender on this host.
    pub lent: Option<&'a LentPayload>,
    /// It came by a path that cannot corrupt it (shared memory): a frame
    /// without a checksum is whole.
    pub vouched: bool,
    /// It is a boxed message ([`boxed`]), not a frame: the word in which
    /// its receiver says how many of the connection's it placed.
    pub boxed: Option<PlacedWord>,
    /// The frames that follow it in this delivery, where the device has
    /// them already (the rest of a superframe's units).
    pub ahead: Ahead<'a>,
}

/// Frames a device will hand on next, in the same call, as they lie in
/// its memory ([`RxMeta::ahead`]): `bytes` starts at the next frame's VIA
/// header (its Ethernet header is not written yet), and holds frames of
/// `stride` bytes from their VIA headers on, the last maybe shorter.
/// They do not change before they are handed on (only their Ethernet
/// headers, which no tag covers, are written), so the engine may check
/// their tags together with this frame's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ahead<'a> {
    pub bytes: &'a [u8],
    pub stride: usize,
}

/// A received frame's payload left in the sending process's memory: up to
/// [`MAX_GATHER`] pieces of process `pid`, which promised (by marking the
/// frame [`TxFrame::lendable`]) to keep them until it is acknowledged. The
/// frame handed over with it holds the headers alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LentPayload {
    pub pid: u32,
    /// (address in the sender, length) of each piece.
    pub pieces: [(u64, u32); MAX_GATHER],
    /// How many entries of `pieces` are used.
    pub n: usize,
    /// A block in memory both ends map, beside the record, through which
    /// the sender may take a share of the copy ([`shared_copy`]). The
    /// device that hands the payload out keeps it mapped until the frame
    /// is released.
    pub shared: Option<SharedCopyRef>,
}

// SAFETY: the shared block is used through atomics alone, by any thread
// of either process; its mapping is the device's to keep (`shared`).
unsafe impl Send for LentPayload {}
// SAFETY: as for Send.
unsafe impl Sync for LentPayload {}

impl LentPayload {
    pub fn len(&self) -> usize {
        self.pieces[..self.n].iter().map(|p| p.1 as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies bytes `[from, from + len)` of the payload to `dst`: with one
    /// `process_vm_readv` (the single copy, done by the kernel), or shared
    /// with the sender where the device gave the two ends a block for it
    /// ([`shared_copy`]). Fails if the range is outside the payload, the
    /// sender is gone or no longer has the memory.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes (by the sender too,
    /// until this returns, if a block is shared).
    pub unsafe fn read(&self, from: usize, dst: *mut u8, len: usize) -> io::Result<()> {
        if let Some(r) = self.shared {
            // SAFETY: the device that handed the payload out keeps the
            // block and the word mapped while it is being read
            // (`LentPayload::shared`); the caller vouches for `dst`.
            return unsafe { r.block.as_ref().pull((r.posted.as_ref(), r.ticket), &self.alone(), from, dst, len) };
        }
        if len == 0 {
            return Ok(());
        }
        let mut remote = [EMPTY_IOV; MAX_GATHER];
        let k = self.ranges(from, len, &mut remote)?;
        let local = libc::iovec { iov_base: dst.cast(), iov_len: len };
        // SAFETY: the caller vouches for `dst`; the kernel checks the
        // remote ranges against the sender's address space.
        let got = unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, remote.as_ptr(), k as libc::c_ulong, 0) };
        moved_all(got, len, || format!("read {got} of {len} lent bytes from process {}", self.pid))
    }

    /// The sender's side: writes bytes `[from, from + len)` of its own
    /// payload (the pieces are this process's memory) to address `dst` of
    /// process `pid`, with one `process_vm_writev`. The kernel checks the
    /// destination against that process's address space.
    pub fn write_to(&self, pid: u32, from: usize, dst: u64, len: usize) -> io::Result<()> {
        let mut local = [EMPTY_IOV; MAX_GATHER];
        let k = self.ranges(from, len, &mut local)?;
        let remote = libc::iovec { iov_base: dst as usize as *mut libc::c_void, iov_len: len };
        // SAFETY: the local ranges are the pieces this process lent (kept
        // until acknowledged); the kernel checks the remote range.
        let put = unsafe { libc::process_vm_writev(pid as libc::pid_t, local.as_ptr(), k as libc::c_ulong, &remote, 1, 0) };
        moved_all(put, len, || format!("wrote {put} of {len} lent bytes to process {pid}"))
    }

    /// The same payload without its shared block (read by this end alone).
    pub fn alone(&self) -> LentPayload {
        LentPayload { shared: None, ..*self }
    }

    /// The pieces' ranges that hold bytes `[from, from + len)`, into
    /// `out`; how many.
    fn ranges(&self, from: usize, len: usize, out: &mut [libc::iovec; MAX_GATHER]) -> io::Result<usize> {
        let (mut k, mut skip, mut want) = (0, from, len);
        for &(addr, plen) in &self.pieces[..self.n] {
            if want == 0 {
                break;
            }
            let plen = plen as usize;
            if skip >= plen {
                skip -= plen;
                continue;
            }
            let take = (plen - skip).min(want);
            out[k] = libc::iovec { iov_base: (addr as usize + skip) as *mut libc::c_void, iov_len: take };
            k += 1;
            (skip, want) = (0, want - take);
        }
        if want != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bytes {from}..{} of a {}-byte lent payload", from + len, self.len())));
        }
        Ok(k)
    }
}

const EMPTY_IOV: libc::iovec = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };

/// A `process_vm_readv`/`writev` that returned `n` for `len` bytes: all
/// moved, the call's error, or a short count (`short` says which).
fn moved_all(n: isize, len: usize, short: impl FnOnce() -> String) -> io::Result<()> {
    match n {
        n if n == len as isize => Ok(()),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, short())),
    }
}

/// A receive filter the engine asks the device to apply (in the kernel for
/// AF_PACKET, in the driver otherwise): accept only frames of `ethertype`
/// whose big-endian 32-bit word at byte `offset` of the Ethernet frame equals
/// one of `accept`. Several processes sharing one interface each see only
/// the frames addressed to their own endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxFilter {
    pub ethertype: u16,
    pub offset: usize,
    pub accept: [u32; 2],
}

impl RxFilter {
    /// The filter applied in software by devices that have no other means.
    pub fn matches(&self, frame: &[u8]) -> bool {
        if frame.len() < 14 || u16::from_be_bytes([frame[12], frame[13]]) != self.ethertype {
            return false;
        }
        match frame.get(self.offset..self.offset + 4) {
            Some(w) => {
                let v = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
                self.accept.contains(&v)
            }
            None => false,
        }
    }
}

/// A NIC as the VI provider sees it: a source and sink of Ethernet frames.
pub trait FrameDevice: Send {
    /// The device's Ethernet address.
    fn mac(&self) -> MacAddr;

    /// The largest Ethernet payload (bytes after the 14-byte header) the
    /// device can send and receive.
    fn mtu(&self) -> usize;

    fn capabilities(&self) -> Capabilities;

    /// A descriptor that polls readable when received frames are waiting.
    fn wait_fd(&self) -> RawFd;

    /// Frames the receive ring holds while nobody takes them (a NIC's
    /// receive descriptors); past them arrivals are dropped. None when the
    /// device does not say (a socket's ring sized in bytes). A sender with
    /// no loss recovery of its own keeps its window under it.
    fn rx_ring_frames(&self) -> Option<usize> {
        None
    }

    /// Installs the receive filter; frames it rejects are never delivered.
    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()>;

    /// Hands up to `budget` received frames (whole Ethernet frames, without
    /// FCS) to `sink`, each a view into the device's ring that is released
    /// when `sink` returns. Returns how many frames were delivered; 0 when
    /// none are waiting (never blocks).
    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize>;

    /// [`FrameDevice::receive`] that says how each frame came
    /// ([`RxMeta`]): with the payload its sender lent (the frame then holds
    /// the headers alone), by a path that cannot corrupt it. Plain
    /// `receive` of a lending device reads lent payloads in itself, so it
    /// always hands out whole frames. Devices that neither lend nor vouch
    /// for single frames use this default.
    fn receive_lent(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8], RxMeta<'_>)) -> io::Result<usize> {
        self.receive(budget, &mut |f| sink(f, RxMeta::default()))
    }

    /// Work the device does for its peers between frames: the shared-
    /// memory wire's share of copying the payloads it lent
    /// ([`shared_copy`]). Returns how much it did (0: nothing; the
    /// default). A wait that sees work done keeps spinning, as for frames.
    /// Asked only of a device whose capabilities say `serves_peers`.
    fn serve_peers(&mut self) -> usize {
        0
    }

    /// The path to frames that start with `head` (their destination and
    /// the words receive filters look at): [`FrameDevice::mtu`] and the
    /// device's capabilities, unless it reaches that destination another
    /// way (shared memory, in a composite device: a larger MTU, and no
    /// corruption on the way).
    fn path_to(&mut self, _head: &[u8]) -> Path {
        Path { mtu: self.mtu(), checksummed: self.capabilities().checksummed, both_ends: false, lends_from: None }
    }

    /// Transmits the frames in order and rings the doorbell once. Returns
    /// how many (a prefix of `frames`) the device accepted; fewer than all
    /// when its transmit ring is full, and the caller retries the rest later.
    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize>;

    /// Can VI `vi`'s messages to the peer its frames start with `head` go
    /// boxed ([`boxed`]), and where? None (the default): only as frames.
    fn box_route(&mut self, _head: &[u8], _vi: u16) -> Option<BoxRoute> {
        None
    }

    /// Appends a boxed message, `header` then `payload`, for `route`:
    /// false when the receiver's ring is full (the caller sends it again
    /// later). Only for a route the device gave.
    fn transmit_boxed(&mut self, _route: &BoxRoute, _header: &[u8; BOX_HEADER_LEN], _payload: &[u8]) -> io::Result<bool> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this device carries no boxed messages"))
    }

    /// Makes memory that transmit may gather from, or that the device DMAs
    /// into, reachable by the device (IOMMU mapping). Software devices need
    /// nothing and use this default.
    fn map_memory(&mut self, _addr: usize, _len: usize) -> io::Result<()> {
        Ok(())
    }

    /// Undoes [`FrameDevice::map_memory`].
    fn unmap_memory(&mut self, _addr: usize, _len: usize) -> io::Result<()> {
        Ok(())
    }

    /// Counters the device keeps, as (name, value) pairs.
    fn stats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// A thread is about to sleep on [`FrameDevice::wait_fd`] until frames
    /// come (called with the device to itself, before every such sleep):
    /// `None` when frames came meanwhile (then it does not sleep), or the
    /// [`Sleep`] it holds while asleep and drops when it woke. A device
    /// whose descriptor turns readable by itself when frames wait (a
    /// socket, a NIC's interrupt) needs nothing: the default. One that
    /// wakes sleepers by hand (shared memory) counts the sleeper until the
    /// `Sleep` is dropped, so that nobody makes a system call to wake a
    /// thread that spins.
    fn prepare_sleep(&mut self) -> Option<Sleep> {
        Some(Sleep::default())
    }

    /// Where the next received frame will show, for a wait that spins
    /// between rounds of progress ([`watch`]): called when a round found
    /// the device empty, with the device to itself. A device that can say
    /// pushes the word its next frame changes (each member of a composite
    /// its own); one that cannot is blind, the default, and waits on it
    /// look in whole rounds.
    fn rx_watch(&self, w: &mut RxWatches) {
        w.blind();
    }

    /// Would a receive find a frame now? None when the device cannot say.
    /// By default what [`FrameDevice::rx_watch`] says, the words collected;
    /// a device that can look at its ring in one load overrides it with
    /// that look (a poll that finds nothing complete asks it before it
    /// runs a round). The VFIO NICs answer it though they report no words
    /// for waits to spin on.
    fn rx_pending(&self) -> Option<bool> {
        let mut w = RxWatches::default();
        self.rx_watch(&mut w);
        w.usable().then(|| w.changed())
    }
}

/// A thread's sleep on a device, from [`FrameDevice::prepare_sleep`]:
/// dropping it says the thread woke. It needs neither the device nor its
/// lock, so a thread that woke says so at once.
#[derive(Default)]
pub struct Sleep {
    ends: Vec<Box<dyn FnOnce() + Send>>,
}

impl Sleep {
    /// A sleep that `end` ends.
    pub fn ended_by(end: impl FnOnce() + Send + 'static) -> Sleep {
        Sleep { ends: vec![Box::new(end)] }
    }

    /// One sleep on several devices (a composite's members).
    pub fn join(mut self, mut other: Sleep) -> Sleep {
        self.ends.append(&mut other.ends);
        self
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        for end in self.ends.drain(..) {
            end();
        }
    }
}

/// The interface named by an M-VIA style device name: `/dev/via_eth0` → `eth0`.
pub fn interface_of(name: &str) -> Option<&str> {
    let s = name.strip_prefix("/dev/via_").or_else(|| name.strip_prefix("via_"))?;
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(interface_of("/dev/via_eth0"), Some("eth0"));
        assert_eq!(interface_of("/dev/via_lo"), Some("lo"));
        assert_eq!(interface_of("/dev/via_"), None);
        assert_eq!(interface_of("eth0"), None);
    }

    #[test]
    fn filter() {
        let f = RxFilter { ethertype: 0x88b5, offset: 18, accept: [7, 0] };
        let mut fr = vec![0u8; 30];
        fr[12] = 0x88;
        fr[13] = 0xb5;
        fr[18..22].copy_from_slice(&7u32.to_be_bytes());
        assert!(f.matches(&fr));
        fr[18..22].copy_from_slice(&0u32.to_be_bytes());
        assert!(f.matches(&fr));
        fr[18..22].copy_from_slice(&9u32.to_be_bytes());
        assert!(!f.matches(&fr));
        fr[13] = 0;
        fr[18..22].copy_from_slice(&7u32.to_be_bytes());
        assert!(!f.matches(&fr));
        assert!(!f.matches(&fr[..20]));
    }

    #[test]
    fn gather_limit() {
        let h = [0u8; 4];
        let mut t = TxFrame::new(&h);
        for _ in 0..MAX_GATHER {
            assert!(t.push(b"ab"));
        }
        assert!(!t.push(b"c"));
        assert_eq!(t.len(), 4 + 2 * MAX_GATHER);
    }
}
