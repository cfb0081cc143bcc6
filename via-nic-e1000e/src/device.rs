//! [`E1000eDevice`]: one 82574 owned by this process through VFIO, as a
//! [`FrameDevice`].
//!
//! Memory layout ([`Layout`]; one [`DmaMemory`] block mapped at one IOVA
//! range): the receive ring, the transmit ring, one receive buffer per
//! receive descriptor (2 KiB; 16 KiB with jumbo frames) and one 2 KiB
//! transmit buffer per transmit descriptor.
//!
//! A frame whose payload lies in registered memory goes out in several
//! descriptors: the header from the transmit buffer of the first, the
//! payload straight from registered memory (zero copy; the 82574 gathers
//! a frame from several descriptors), one descriptor per page it touches
//! ([`page_runs`] says why). Anything else is copied into
//! consecutive transmit buffers, one descriptor each (one for a frame of
//! Ethernet's MTU, up to five for a jumbo frame). A batch that sends from user memory
//! returns only once the NIC has released it, so the caller may reuse
//! that memory at once. Writing the transmit tail (TDT) is the doorbell.
//!
//! Receive: the NIC owns the descriptors from its head up to the tail
//! (RDT); a written-back descriptor has DD set. Buffers are handed back
//! in a batch, one RDT write per `receive` call. Receive interrupts (RXT0,
//! with every delay timer and the throttle at 0) reach a VFIO eventfd that
//! is the device's wait descriptor; they are acknowledged and let through
//! again only before a sleep (`prepare_sleep`), so a spinning process takes
//! one interrupt, not one per frame, and no system call per empty look.

use crate::desc::{self, RxDone, DESC_LEN};
use crate::regs::{self, ctrl, eerd, int, rctl, tctl};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;
use via_device::{Capabilities, FrameDevice, MacAddr, RxFilter, Sleep, TxFrame};
use via_vfio::{pci_cmd, spin_until, DmaMemory, IommuMappings, NicCounters, Registers, VfioDevice, PAGE};

/// Transmit descriptors: a zero-copy frame takes one for its header and one
/// per page of its payload, a copied one one per 2 KiB.
pub const TX_RING: usize = 128;
/// Bytes of each transmit buffer.
const TX_BUF: usize = 2048;
/// Ethernet's payload bytes, the default MTU.
pub const MTU: usize = 1500;
/// The largest MTU: the 82574 receives frames of up to 9,018 bytes with
/// their CRC ("Jumbo Frames" in the datasheet's receive chapter).
pub const MAX_MTU: usize = 9000;
const ETH_HEADER: usize = 14;
/// Bytes of receive buffers the driver pins, whatever their size.
const RX_BYTES: usize = 2 << 20;
/// How long a batch waits for the NIC to release user memory, reset for
/// the NIC to come out of reset, and an EEPROM read for its word.
const NIC_TIMEOUT: Duration = Duration::from_millis(500);

const RX_RING_OFF: usize = 0;

/// Where the rings and buffers lie in the DMA block, for one MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Receive descriptors (frames the NIC can take while the process is
    /// busy): 1,024 of 2 KiB, or 128 of 16 KiB with jumbo frames.
    pub rx_ring: usize,
    /// Bytes of each receive buffer.
    pub rx_buf: usize,
    /// RCTL's buffer size and long-packet bits for `rx_buf`.
    pub rctl_size: u32,
}

impl Layout {
    /// The layout for `mtu` (68..=[`MAX_MTU`]).
    pub fn for_mtu(mtu: usize) -> Layout {
        let (rx_buf, rctl_size) = if mtu <= MTU { (2048, 0) } else { (16384, rctl::LPE | rctl::BSEX | rctl::BSIZE_16384) };
        Layout { rx_ring: RX_BYTES / rx_buf, rx_buf, rctl_size }
    }

    fn tx_ring_off(&self) -> usize {
        self.rx_ring * DESC_LEN
    }

    fn rx_buf_off(&self) -> usize {
        self.tx_ring_off() + TX_RING * DESC_LEN
    }

    fn tx_buf_off(&self) -> usize {
        self.rx_buf_off() + self.rx_ring * self.rx_buf
    }

    fn len(&self) -> usize {
        self.tx_buf_off() + TX_RING * TX_BUF
    }
}

// The rings' lengths must be multiples of 128 bytes (RDLEN, TDLEN).
const _: () = assert!((RX_BYTES / 16384 * DESC_LEN).is_multiple_of(128) && (TX_RING * DESC_LEN).is_multiple_of(128));


/// An Intel 82574 owned through VFIO.
pub struct E1000eDevice {
    address: String,
    mac: MacAddr,
    mtu: usize,
    layout: Layout,
    /// The registers (BAR0, memory space).
    regs: Registers,
    mem: DmaMemory,
    mem_iova: u64,
    iommu: IommuMappings,
    /// The next receive descriptor the NIC will write back.
    rx_next: usize,
    /// The next free transmit descriptor (the tail we write).
    tx_next: usize,
    /// The oldest transmit descriptor not yet seen done.
    tx_clean: usize,
    tx_busy: usize,
    filter: Option<RxFilter>,
    irq_fd: RawFd,
    counters: NicCounters,
    // Last, so that it is closed after the NIC was stopped in `drop`.
    vfio: VfioDevice,
}

impl E1000eDevice {
    /// Opens the 82574 at PCI `address` (bound to vfio-pci), resets it and
    /// brings it up for frames of `mtu` payload bytes (68..=[`MAX_MTU`]).
    pub fn open(address: &str, mtu: usize) -> io::Result<E1000eDevice> {
        if !(68..=MAX_MTU).contains(&mtu) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{address}: MTU {mtu}; the 82574 takes 68..={MAX_MTU}")));
        }
        let layout = Layout::for_mtu(mtu);
        let vfio = VfioDevice::open(address)?;
        let bar = vfio.region(0)?;
        if bar.size < 0x6000 {
            return Err(io::Error::other(format!("{address}: BAR0 is {} bytes; an 82574's register space is 128 KiB", bar.size)));
        }
        let regs = Registers::new(&vfio, bar)?;
        // The registers decoded; bus mastering stays off until `bring_up`
        // has stopped and reset the NIC.
        pci_cmd::decode_without_mastering(&vfio)?;
        let mem = DmaMemory::new(layout.len())?;
        let mut iommu = IommuMappings::default();
        let mem_iova = iommu.map_own(&vfio, &mem)?;
        let mut d = E1000eDevice {
            address: address.to_string(),
            mac: MacAddr::ZERO,
            mtu,
            layout,
            regs,
            mem,
            mem_iova,
            iommu,
            rx_next: 0,
            tx_next: 0,
            tx_clean: 0,
            tx_busy: 0,
            filter: None,
            irq_fd: -1,
            counters: NicCounters::default(),
            vfio,
        };
        d.bring_up()?;
        Ok(d)
    }

    /// The PCI address this device was opened at.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn iova_of(&self, off: usize) -> u64 {
        self.mem_iova + off as u64
    }

    fn desc_ptr(&self, ring_off: usize, i: usize) -> *mut u32 {
        self.mem.at(ring_off + i * DESC_LEN).cast()
    }

    /// Writes descriptor `i` of a ring: buffer address, then the command
    /// dword, then the status dword (zero: not done).
    fn put_desc(&self, ring_off: usize, i: usize, addr: u64, command: u32) {
        let p = self.desc_ptr(ring_off, i);
        // SAFETY: `p` points at descriptor `i` of a ring inside our DMA
        // memory (16 bytes, 16-byte aligned). The NIC reads descriptors
        // only between its head and our tail, which is written after this
        // (with a release fence before it, in the callers).
        unsafe {
            std::ptr::write_volatile(p, (addr as u32).to_le());
            std::ptr::write_volatile(p.add(1), ((addr >> 32) as u32).to_le());
            std::ptr::write_volatile(p.add(2), command.to_le());
            std::ptr::write_volatile(p.add(3), 0);
        }
    }

    /// A descriptor's second quadword (length/command dword, status
    /// dword), the status read first and with acquire ordering for what
    /// the NIC wrote before setting DD.
    fn desc_status(&self, ring_off: usize, i: usize) -> (u32, u32) {
        let p = self.desc_ptr(ring_off, i);
        // SAFETY: as in `put_desc`; volatile loads of the descriptor.
        let status = u32::from_le(unsafe { std::ptr::read_volatile(p.add(3)) });
        fence(Ordering::Acquire);
        // SAFETY: as above.
        let word = u32::from_le(unsafe { std::ptr::read_volatile(p.add(2)) });
        (word, status)
    }

    /// Has the NIC written a frame back into the next receive descriptor
    /// (its status dword's DD bit set)? What a sleep and a poll look at.
    fn frame_waiting(&self) -> bool {
        self.desc_status(RX_RING_OFF, self.rx_next).1 & desc::rx::DD != 0
    }

    /// Waits until `done` holds of the registers, or fails naming `what`.
    fn wait_for(&self, what: &str, done: impl Fn(&Registers) -> bool) -> io::Result<()> {
        if spin_until(NIC_TIMEOUT, || done(&self.regs)) {
            return Ok(());
        }
        Err(io::Error::other(format!("{}: {what} within {NIC_TIMEOUT:?}", self.address)))
    }

    /// The station address: RAL0/RAH0 as the NIC loaded them from its
    /// EEPROM at reset, or the EEPROM's words 0-2 through EERD.
    fn read_mac(&self) -> io::Result<MacAddr> {
        let (lo, hi) = (self.regs.read(regs::RAL0), self.regs.read(regs::RAH0));
        if hi & regs::RAH_AV != 0 {
            let b = lo.to_le_bytes();
            let h = hi.to_le_bytes();
            return Ok(MacAddr([b[0], b[1], b[2], b[3], h[0], h[1]]));
        }
        let mut m = [0u8; 6];
        for w in 0..3u32 {
            self.regs.write(regs::EERD, eerd::START | w << eerd::ADDR_SHIFT);
            self.wait_for("the EEPROM did not answer a read", |r| r.read(regs::EERD) & eerd::DONE != 0)?;
            let v = (self.regs.read(regs::EERD) >> eerd::DATA_SHIFT) as u16;
            m[2 * w as usize..2 * w as usize + 2].copy_from_slice(&v.to_le_bytes());
        }
        Ok(MacAddr(m))
    }

    /// Stop, reset, station address, rings, receive and transmit on,
    /// interrupts (the initialisation order of the datasheet's "General
    /// Configuration", "Receive Initialization" and "Transmit
    /// Initialization" sections).
    fn bring_up(&mut self) -> io::Result<()> {
        let _ = self.vfio.reset();
        // A process killed with the NIC running leaves it receiving and
        // transmitting with ring addresses of the dead process's container
        // (vfio-pci turns bus mastering off, and resets the NIC only where
        // it has a way to). Stop both and mask every interrupt before the
        // device reset, which on QEMU's model reloads only the station
        // address: no descriptor fetch may use a stale address once
        // mastering is on.
        self.regs.write(regs::IMC, int::ALL);
        self.regs.write(regs::RCTL, 0);
        self.regs.write(regs::TCTL, 0);
        let c = self.regs.read(regs::CTRL);
        self.regs.write(regs::CTRL, c | ctrl::RST);
        self.wait_for("the NIC did not leave reset", |r| r.read(regs::CTRL) & ctrl::RST == 0)?;
        self.regs.write(regs::IMC, int::ALL);
        let icr = self.regs.read(regs::ICR);
        self.regs.write(regs::ICR, icr);
        pci_cmd::allow_mastering(&self.vfio)?;
        let c = self.regs.read(regs::CTRL);
        self.regs.write(regs::CTRL, c | ctrl::SLU);

        self.mac = self.read_mac()?;
        if self.mac == MacAddr::ZERO || self.mac == MacAddr::BROADCAST {
            return Err(io::Error::other(format!("{}: the EEPROM holds no station address ({})", self.address, self.mac)));
        }
        // Our address in receive address 0, no multicast.
        let m = self.mac.0;
        self.regs.write(regs::RAL0, u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
        self.regs.write(regs::RAH0, u32::from(u16::from_le_bytes([m[4], m[5]])) | regs::RAH_AV);
        for i in 0..regs::MTA_WORDS {
            self.regs.write(regs::MTA + 4 * i, 0);
        }
        self.regs.write(regs::RXCSUM, 0);
        // Interrupts at once: no delay timers, no throttling.
        for r in [regs::ITR, regs::RDTR, regs::RADV, regs::TIDV, regs::TADV] {
            self.regs.write(r, 0);
        }

        // Receive ring: every descriptor with its buffer; all but one
        // belong to the NIC (head 0, tail one short of the end).
        let l = self.layout;
        for i in 0..l.rx_ring {
            self.put_desc(RX_RING_OFF, i, self.iova_of(l.rx_buf_off() + i * l.rx_buf), 0);
        }
        let rx = self.iova_of(RX_RING_OFF);
        self.regs.write(regs::RDBAL, rx as u32);
        self.regs.write(regs::RDBAH, (rx >> 32) as u32);
        self.regs.write(regs::RDLEN, (l.rx_ring * DESC_LEN) as u32);
        self.regs.write(regs::RDH, 0);
        fence(Ordering::Release);
        self.regs.write(regs::RDT, (l.rx_ring - 1) as u32);
        self.rx_next = 0;

        // Transmit ring: empty (head = tail = 0).
        for i in 0..TX_RING {
            self.put_desc(l.tx_ring_off(), i, 0, 0);
        }
        let tx = self.iova_of(l.tx_ring_off());
        self.regs.write(regs::TDBAL, tx as u32);
        self.regs.write(regs::TDBAH, (tx >> 32) as u32);
        self.regs.write(regs::TDLEN, (TX_RING * DESC_LEN) as u32);
        self.regs.write(regs::TDH, 0);
        self.regs.write(regs::TDT, 0);
        (self.tx_next, self.tx_clean, self.tx_busy) = (0, 0, 0);
        self.regs.write(regs::TIPG, regs::TIPG_DEFAULT);

        self.irq_fd = self.vfio.enable_intx()?;
        self.regs.write(regs::IMS, int::RXT0 | int::RXO);
        self.regs.write(regs::TCTL, tctl::EN | tctl::PSP | tctl::CT | tctl::COLD);
        self.regs.write(regs::RCTL, rctl::EN | rctl::BAM | rctl::SECRC | l.rctl_size);
        Ok(())
    }

    /// Before a sleep, if an interrupt came since the last: acknowledge
    /// its causes at the NIC and let VFIO deliver the next one. (While a
    /// process spins, VFIO keeps INTx masked after the first interrupt: no
    /// interrupt per frame, and no system call per empty look at the ring.)
    fn rearm_interrupt(&mut self) {
        if !self.vfio.take_interrupt() {
            return;
        }
        self.counters.interrupts += 1;
        let causes = self.regs.read(regs::ICR);
        self.regs.write(regs::ICR, causes);
        if causes & int::RXO != 0 {
            self.counters.rx_no_buffer += 1;
        }
        let _ = self.vfio.unmask_intx();
    }

    /// Frees transmit descriptors the NIC has finished with.
    fn reclaim(&mut self) {
        while self.tx_busy > 0 && self.desc_status(self.layout.tx_ring_off(), self.tx_clean).1 & desc::tx::DD != 0 {
            self.tx_clean = (self.tx_clean + 1) % TX_RING;
            self.tx_busy -= 1;
        }
    }

    /// The DMA offset of transmit buffer `i`.
    fn tx_buf(&self, i: usize) -> usize {
        self.layout.tx_buf_off() + i * TX_BUF
    }

    /// Copies frame `f` into consecutive transmit buffers and queues one
    /// descriptor for each (the caller checked that the ring has room).
    fn copy_out(&mut self, f: &TxFrame<'_>) {
        let parts = std::iter::once(f.header).chain(f.pieces().iter().copied());
        let buffers = f.len().div_ceil(TX_BUF);
        let first = self.tx_next;
        split_into_buffers(parts, TX_BUF, |k, at, bytes| {
            let off = self.tx_buf((first + k) % TX_RING);
            // SAFETY: `at + bytes.len() <= TX_BUF` (split_into_buffers'
            // promise): inside transmit buffer `first + k`.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.at(off + at), bytes.len()) };
        });
        let mut left = f.len();
        for k in 0..buffers {
            let n = left.min(TX_BUF);
            left -= n;
            let off = self.tx_buf((first + k) % TX_RING);
            self.queue_tx(self.iova_of(off), n, left == 0);
        }
    }

    /// Queues descriptor `i` of the transmit ring (the tail is written
    /// once per batch).
    fn queue_tx(&mut self, addr: u64, len: usize, last: bool) -> usize {
        let i = self.tx_next;
        self.put_desc(self.layout.tx_ring_off(), i, addr, desc::tx_command(len, last));
        self.tx_next = (i + 1) % TX_RING;
        self.tx_busy += 1;
        i
    }
}

/// `[iova, iova + len)` cut at page boundaries: (start, length) of each
/// run. A payload goes out in one descriptor per page it touches: QEMU's
/// 82574 maps each descriptor's buffer through the IOMMU as one piece and
/// drops the frame when the guest pages behind it are not contiguous,
/// which registered memory's pages need not be (the NIC itself gathers
/// any run of descriptors, so real hardware loses nothing by this).
fn page_runs(iova: u64, len: usize) -> impl Iterator<Item = (u64, usize)> {
    let end = iova + len as u64;
    let mut at = iova;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let next = ((at / PAGE as u64) + 1) * PAGE as u64;
            let run = (next.min(end) - at) as usize;
            let r = (at, run);
            at += run as u64;
            r
        })
    })
}

/// Lays `parts`, one after the other, into buffers of `size` bytes:
/// `put(k, at, bytes)` for each run of bytes that goes at offset `at` of
/// buffer `k` (`at + bytes.len() <= size`). Every buffer but the last is
/// filled whole.
fn split_into_buffers<'a>(parts: impl Iterator<Item = &'a [u8]>, size: usize, mut put: impl FnMut(usize, usize, &'a [u8])) {
    let (mut k, mut at) = (0, 0);
    for mut part in parts {
        while !part.is_empty() {
            let n = part.len().min(size - at);
            put(k, at, &part[..n]);
            part = &part[n..];
            at += n;
            if at == size {
                (k, at) = (k + 1, 0);
            }
        }
    }
}

impl FrameDevice for E1000eDevice {
    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: true, needs_pinning: true, reorders: false, serves_peers: false }
    }

    fn wait_fd(&self) -> RawFd {
        self.irq_fd
    }

    fn rx_ring_frames(&self) -> Option<usize> {
        Some(self.layout.rx_ring)
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        self.filter = Some(filter);
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        let mut returned = None;
        while n < budget {
            let i = self.rx_next;
            let (word, st) = self.desc_status(RX_RING_OFF, i);
            if st & desc::rx::DD == 0 {
                break;
            }
            let off = self.layout.rx_buf_off() + i * self.layout.rx_buf;
            match desc::rx_done(word, st, self.layout.rx_buf) {
                RxDone::Frame(len) => {
                    // SAFETY: the NIC wrote the buffer back (DD set, read
                    // with acquire); `len` <= the buffer's size is checked.
                    let frame = unsafe { std::slice::from_raw_parts(self.mem.at(off), len) };
                    if self.filter.is_none_or(|f| f.matches(frame)) {
                        sink(frame);
                        n += 1;
                        self.counters.rx_frames += 1;
                    } else {
                        self.counters.rx_filtered += 1;
                    }
                }
                RxDone::Bad => self.counters.rx_bad += 1,
            }
            self.put_desc(RX_RING_OFF, i, self.iova_of(off), 0);
            returned = Some(i);
            self.rx_next = if i + 1 == self.layout.rx_ring { 0 } else { i + 1 }; // (no division per frame)
        }
        if let Some(i) = returned {
            // The buffers go back to the NIC: the tail now stands on the
            // last descriptor taken, so the one-slot gap stays.
            fence(Ordering::Release);
            self.regs.write(regs::RDT, i as u32);
        }
        Ok(n)
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        self.reclaim();
        let max = ETH_HEADER + self.mtu;
        let mut sent = 0;
        let mut wait_for: Option<usize> = None;
        for f in frames {
            let len = f.len();
            if !(ETH_HEADER..=max).contains(&len) || f.header.len() > TX_BUF {
                if sent > 0 {
                    break;
                }
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("frame of {len} bytes; this 82574 sends {ETH_HEADER}..={max} (MTU {})", self.mtu)));
            }
            let direct = match f.pieces() {
                [p] if !p.is_empty() => self.iommu.translate(p.as_ptr() as usize, p.len()).map(|iova| (iova, p.len())),
                _ => None,
            };
            let needed = match direct {
                Some((iova, plen)) => 1 + page_runs(iova, plen).count(),
                None => len.div_ceil(TX_BUF),
            };
            // The ring never fills up: a full ring would have head == tail,
            // which reads as empty.
            if self.tx_busy + needed > TX_RING - 1 {
                self.counters.tx_ring_full += 1;
                break;
            }
            match direct {
                Some((iova, plen)) => {
                    let off = self.tx_buf(self.tx_next);
                    // SAFETY: the header fits the slot's TX_BUF bytes (checked above).
                    unsafe { std::ptr::copy_nonoverlapping(f.header.as_ptr(), self.mem.at(off), f.header.len()) };
                    self.queue_tx(self.iova_of(off), f.header.len(), false);
                    for (at, n) in page_runs(iova, plen) {
                        wait_for = Some(self.queue_tx(at, n, at + n as u64 == iova + plen as u64));
                    }
                    self.counters.tx_zero_copy += 1;
                }
                None => {
                    self.copy_out(f);
                    self.counters.tx_copied += u64::from(f.pieces > 0);
                }
            }
            sent += 1;
        }
        if sent > 0 {
            // The doorbell: the transmit tail, after the descriptors.
            fence(Ordering::Release);
            self.regs.write(regs::TDT, self.tx_next as u32);
            self.counters.tx_frames += sent as u64;
        }
        if let Some(i) = wait_for {
            // User memory must not be reused before the NIC has read it.
            if !spin_until(NIC_TIMEOUT, || self.desc_status(self.layout.tx_ring_off(), i).1 & desc::tx::DD != 0) {
                return Err(io::Error::other(format!("{}: the NIC did not send within {NIC_TIMEOUT:?}", self.address)));
            }
            self.reclaim();
        }
        Ok(sent)
    }

    fn map_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.iommu.map(&self.vfio, addr, len, "82574")
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.iommu.unmap(&self.vfio, addr, len, "82574")
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        self.counters.stats(self.iommu.user_count())
    }

    fn prepare_sleep(&mut self) -> Option<Sleep> {
        self.rearm_interrupt();
        // A frame written back before the acknowledgement above raised no
        // interrupt the sleeper will see: take it instead of sleeping.
        (!self.frame_waiting()).then(Sleep::default)
    }

    /// Is a frame there? The next receive descriptor's status dword says:
    /// the NIC sets DD once it wrote a frame back there. One load of our
    /// memory, so a poll that finds nothing complete skips its round of
    /// progress. (No watched word for waits to spin on, `rx_watch`, as
    /// for the tulip: its waits look in rounds.)
    fn rx_pending(&self) -> Option<bool> {
        Some(self.frame_waiting())
    }
}

impl Drop for E1000eDevice {
    /// Stops the NIC before its memory goes: interrupts masked, receive
    /// and transmit off, device reset; then every DMA mapping is removed
    /// and bus mastering turned off. (If the process dies instead, closing
    /// the VFIO files makes the kernel disable bus mastering and drop the
    /// container's mappings; the next open stops the NIC before it turns
    /// bus mastering on again.)
    fn drop(&mut self) {
        self.regs.write(regs::IMC, int::ALL);
        self.regs.write(regs::RCTL, 0);
        self.regs.write(regs::TCTL, 0);
        let c = self.regs.read(regs::CTRL);
        self.regs.write(regs::CTRL, c | ctrl::RST);
        self.iommu.clear(&self.vfio);
        let _ = pci_cmd::stop_mastering(&self.vfio);
    }
}

#[cfg(test)]
mod tests {
    use super::{page_runs, split_into_buffers};

    #[test]
    fn payloads_are_cut_at_page_boundaries() {
        let runs = |iova, len| page_runs(iova, len).collect::<Vec<_>>();
        assert_eq!(runs(0x1000_0000, 1436), [(0x1000_0000, 1436)], "inside one page");
        assert_eq!(runs(0x1000_0f00, 1436), [(0x1000_0f00, 0x100), (0x1000_1000, 1436 - 0x100)]);
        assert_eq!(runs(0x1000_0f00, 9000), [(0x1000_0f00, 0x100), (0x1000_1000, 4096), (0x1000_2000, 4096), (0x1000_3000, 9000 - 0x100 - 8192)]);
        assert_eq!(runs(0x1000_1000, 4096), [(0x1000_1000, 4096)], "exactly one page");
        assert!(runs(0x1000_1000, 0).is_empty());
    }

    /// The buffers `split_into_buffers` fills, as vectors.
    fn split(parts: &[&[u8]], size: usize) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        split_into_buffers(parts.iter().copied(), size, |k, at, bytes| {
            assert!(at + bytes.len() <= size, "a run past its buffer");
            if out.len() == k {
                out.push(Vec::new());
            }
            assert_eq!(out.len(), k + 1, "buffers in order");
            assert_eq!(out[k].len(), at, "runs in order, no gap");
            out[k].extend_from_slice(bytes);
        });
        out
    }

    #[test]
    fn a_frame_fills_whole_buffers_but_the_last() {
        let frame: Vec<u8> = (0..9014u32).map(|i| i as u8).collect();
        // A header, a payload in three pieces of odd sizes.
        let parts: [&[u8]; 4] = [&frame[..14], &frame[14..3000], &frame[3000..3001], &frame[3001..]];
        let bufs = split(&parts, 2048);
        assert_eq!(bufs.iter().map(Vec::len).collect::<Vec<_>>(), [2048, 2048, 2048, 2048, 822]);
        assert_eq!(bufs.concat(), frame, "every byte once, in order");
        assert_eq!(split(&[&frame[..60]], 2048), [frame[..60].to_vec()], "a small frame: one buffer");
        assert_eq!(split(&[&frame[..2048], &[]], 2048).len(), 1, "exactly one buffer's worth, and an empty piece");
    }
}
