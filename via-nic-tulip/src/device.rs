//! [`TulipDevice`]: one 2114x owned by this process through VFIO, as a
//! [`FrameDevice`].
//!
//! Memory layout (one [`DmaMemory`] block mapped at one IOVA range):
//! the receive ring, the transmit ring, one 2 KiB receive buffer per
//! receive descriptor and one 2 KiB transmit buffer per transmit
//! descriptor. A transmitted frame's header always goes from its transmit
//! buffer (buffer 1); a payload that lies in registered memory goes
//! straight from there (buffer 2), anything else is copied behind the
//! header. Registered memory is mapped into the IOMMU by
//! [`FrameDevice::map_memory`] and unmapped by `unmap_memory`
//! (`via_vfio::IommuMappings`).
//!
//! Transmit completion is polled (OWN clears); a batch that sends from user
//! memory returns only once the NIC has released it, so the caller may
//! reuse that memory at once. Receive interrupts reach a VFIO eventfd that
//! is the device's wait descriptor; they are acknowledged and let through
//! again only before a sleep (`prepare_sleep`), so a spinning process takes
//! one interrupt, not one per frame, and no system call per empty look.
//! A poll that finds nothing complete asks the next receive descriptor's
//! OWN bit (`rx_pending`, a load of our memory) before it runs a round.

use crate::desc::{self, Desc, RxDone, DESC_LEN, OWN};
use crate::regs::{self, op_mode, status};
use crate::setup;
use crate::srom::{self, Csr9};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;
use via_device::{Capabilities, FrameDevice, MacAddr, RxFilter, Sleep, TxFrame};
use via_vfio::{pci_cmd, spin_until, DmaMemory, IommuMappings, NicCounters, Registers, VfioDevice};

/// Receive descriptors (frames the NIC can take while the process is busy).
pub const RX_RING: usize = 1024;
/// Transmit descriptors.
pub const TX_RING: usize = 64;
/// Bytes of each receive and transmit buffer.
const BUF: usize = 2048;
/// Largest frame the receive buffers are declared to hold (RDES1 size).
const RX_BUF_LEN: usize = 1536;
/// Ethernet payload bytes.
pub const MTU: usize = 1500;
const ETH_HEADER: usize = 14;
/// How long a batch waits for the NIC to release user memory, and how long
/// bring-up waits for the setup frame, before the NIC is declared stuck.
const NIC_TIMEOUT: Duration = Duration::from_millis(500);

const RX_RING_OFF: usize = 0;
const TX_RING_OFF: usize = RX_RING * DESC_LEN;
const RX_BUF_OFF: usize = TX_RING_OFF + TX_RING * DESC_LEN;
const TX_BUF_OFF: usize = RX_BUF_OFF + RX_RING * BUF;
const DMA_LEN: usize = TX_BUF_OFF + TX_RING * BUF;


/// A DEC 2114x owned through VFIO.
pub struct TulipDevice {
    address: String,
    mac: MacAddr,
    /// The CSRs (BAR1, or BAR0 where BAR1 is absent).
    csrs: Registers,
    mem: DmaMemory,
    mem_iova: u64,
    iommu: IommuMappings,
    rx_next: usize,
    /// Frames taken since a receive call last found the ring empty.
    since_empty: usize,
    tx_next: usize,
    tx_clean: usize,
    tx_busy: usize,
    filter: Option<RxFilter>,
    irq_fd: RawFd,
    counters: NicCounters,
    // Last, so that it is closed after the NIC was stopped in `drop`.
    vfio: VfioDevice,
}

struct Csr9Bus<'a>(&'a TulipDevice);

impl Csr9 for Csr9Bus<'_> {
    fn write(&mut self, v: u32) {
        self.0.write_csr(regs::SROM_MII, v);
    }
    fn read(&mut self) -> u32 {
        self.0.read_csr(regs::SROM_MII)
    }
}

impl TulipDevice {
    /// Opens the tulip at PCI `address` (bound to vfio-pci), resets it and
    /// brings it up.
    pub fn open(address: &str) -> io::Result<TulipDevice> {
        let vfio = VfioDevice::open(address)?;
        // BAR1 is the memory-space copy of the CSRs; BAR0 the I/O-space one.
        let bar = vfio.region(1).or_else(|_| vfio.region(0))?;
        if bar.size < 128 {
            return Err(io::Error::other(format!("{address}: BAR{} is {} bytes; a 2114x has 128", bar.index, bar.size)));
        }
        let csrs = Registers::new(&vfio, bar)?;
        // The CSRs decoded; bus mastering stays off until `bring_up` has
        // reset the NIC.
        pci_cmd::decode_without_mastering(&vfio)?;
        let mem = DmaMemory::new(DMA_LEN)?;
        let mut iommu = IommuMappings::default();
        let mem_iova = iommu.map_own(&vfio, &mem)?;
        let mut d = TulipDevice {
            address: address.to_string(),
            mac: MacAddr::ZERO,
            csrs,
            mem,
            mem_iova,
            iommu,
            rx_next: 0,
            since_empty: 0,
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

    fn read_csr(&self, off: u64) -> u32 {
        self.csrs.read(off)
    }

    fn write_csr(&self, off: u64, v: u32) {
        self.csrs.write(off, v)
    }

    fn iova_of(&self, off: usize) -> u32 {
        (self.mem_iova + off as u64) as u32
    }

    fn desc_ptr(&self, ring_off: usize, i: usize) -> *mut u32 {
        self.mem.at(ring_off + i * DESC_LEN).cast()
    }

    /// Writes a descriptor, status word last so the NIC never sees OWN on
    /// a half-written descriptor.
    fn put_desc(&self, ring_off: usize, i: usize, d: Desc) {
        let p = self.desc_ptr(ring_off, i);
        // SAFETY: `p` points at descriptor `i` of a ring inside our DMA
        // memory (16 bytes, 4-byte aligned); the NIC reads it concurrently,
        // hence volatile stores and the release fence before OWN.
        unsafe {
            std::ptr::write_volatile(p.add(1), d.control.to_le());
            std::ptr::write_volatile(p.add(2), d.buf1.to_le());
            std::ptr::write_volatile(p.add(3), d.buf2.to_le());
            fence(Ordering::Release);
            std::ptr::write_volatile(p, d.status.to_le());
        }
    }

    /// The status word of a descriptor, with acquire ordering for what the
    /// NIC wrote before releasing it.
    fn desc_status(&self, ring_off: usize, i: usize) -> u32 {
        // SAFETY: as in `put_desc`; a volatile load of the status word.
        let s = u32::from_le(unsafe { std::ptr::read_volatile(self.desc_ptr(ring_off, i)) });
        fence(Ordering::Acquire);
        s
    }

    /// Has the NIC written a frame into the next receive descriptor (its
    /// RDES0 OWN bit clear, §4.2.1)? What a sleep and a poll look at.
    fn frame_waiting(&self) -> bool {
        self.desc_status(RX_RING_OFF, self.rx_next) & OWN == 0
    }

    /// Reset, station address, rings, setup frame, interrupts, start
    /// (the bring-up order of the 21143 HRM §4.3 and the Linux driver).
    fn bring_up(&mut self) -> io::Result<()> {
        let _ = self.vfio.reset();
        self.write_csr(regs::BUS_MODE, regs::BUS_MODE_SWR);
        if !spin_until(NIC_TIMEOUT, || self.read_csr(regs::BUS_MODE) & regs::BUS_MODE_SWR == 0) {
            return Err(io::Error::other(format!("{}: the NIC did not leave software reset", self.address)));
        }
        // Only a reset NIC may master the bus. A process killed with the NIC
        // running leaves its receive and transmit processes started, with
        // ring addresses of the dead process's container: vfio-pci turns
        // bus mastering off but resets the NIC only if it has a way to
        // (QEMU's 21143 has no FLR or power-management capability and sits
        // on the root bus, so it has none: CSR6 still shows both processes
        // started after the kill, as the guest suite prints). CSR0 SWR
        // (21143 HRM §3.2.2.1) stops both processes and clears the CSRs, so
        // no descriptor fetch uses a stale address once mastering is on.
        pci_cmd::allow_mastering(&self.vfio)?;
        self.write_csr(regs::BUS_MODE, regs::BUS_MODE_X86);
        self.mac = srom::read_mac(&mut Csr9Bus(self));
        if self.mac == MacAddr::ZERO || self.mac == MacAddr::BROADCAST {
            return Err(io::Error::other(format!("{}: the serial ROM holds no station address ({})", self.address, self.mac)));
        }
        for i in 0..RX_RING {
            let d = desc::rx_ready(self.iova_of(RX_BUF_OFF + i * BUF), RX_BUF_LEN, i == RX_RING - 1);
            self.put_desc(RX_RING_OFF, i, d);
        }
        for i in 0..TX_RING {
            self.put_desc(TX_RING_OFF, i, Desc { control: if i == TX_RING - 1 { desc::tx::TER } else { 0 }, ..Desc::default() });
        }
        // The setup frame goes out as the first transmit descriptor.
        let frame = setup::perfect_filter(self.mac);
        // SAFETY: transmit buffer 0 is BUF >= 192 bytes of our DMA memory.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), self.mem.at(TX_BUF_OFF), frame.len()) };
        self.put_desc(TX_RING_OFF, 0, desc::tx_setup(self.iova_of(TX_BUF_OFF), false));
        self.write_csr(regs::RX_LIST, self.iova_of(RX_RING_OFF));
        self.write_csr(regs::TX_LIST, self.iova_of(TX_RING_OFF));
        // Transmit only, promiscuous off: the NIC loads the filter.
        self.write_csr(regs::OP_MODE, op_mode::ST);
        self.write_csr(regs::TX_POLL, 1);
        if !spin_until(NIC_TIMEOUT, || self.desc_status(TX_RING_OFF, 0) & OWN == 0) {
            return Err(io::Error::other(format!("{}: the NIC did not take the setup frame (is bus mastering allowed and the IOMMU mapping in place?)", self.address)));
        }
        self.tx_next = 1;
        self.tx_clean = 1;
        self.write_csr(regs::STATUS, status::CLEAR_ALL);
        self.irq_fd = self.vfio.enable_intx()?;
        self.write_csr(regs::INT_ENABLE, regs::INTERRUPTS);
        self.write_csr(regs::OP_MODE, op_mode::SR | op_mode::ST);
        self.write_csr(regs::RX_POLL, 1);
        Ok(())
    }

    /// Before a sleep, if an interrupt came since the last: acknowledge it
    /// at the NIC, restart a receive process that ran out of buffers, and
    /// let VFIO deliver the next one. (While a process spins, VFIO keeps
    /// INTx masked after the first interrupt: no interrupt per frame, and
    /// no system call per empty look at the ring.)
    fn rearm_interrupt(&mut self) {
        if !self.vfio.take_interrupt() {
            return;
        }
        self.counters.interrupts += 1;
        self.acknowledge();
        let _ = self.vfio.unmask_intx();
    }

    /// Clears CSR5's causes and restarts a receive process that ran out of
    /// buffers (RU: it stays suspended until a receive poll demand).
    fn acknowledge(&mut self) {
        let st = self.read_csr(regs::STATUS);
        self.write_csr(regs::STATUS, st & status::CLEAR_ALL);
        if st & status::RU != 0 {
            self.counters.rx_no_buffer += 1;
            self.write_csr(regs::RX_POLL, 1);
        }
    }

    /// Frees transmit descriptors the NIC has finished with.
    fn reclaim(&mut self) {
        while self.tx_busy > 0 && self.desc_status(TX_RING_OFF, self.tx_clean) & OWN == 0 {
            self.tx_clean = (self.tx_clean + 1) % TX_RING;
            self.tx_busy -= 1;
        }
    }

    /// The bus address of `[addr, addr + len)` when it lies inside one
    /// mapping of registered memory (below 4 GiB: the IOVA window).
    fn translate(&self, addr: usize, len: usize) -> Option<u32> {
        self.iommu.translate(addr, len).map(|a| a as u32)
    }
}

impl FrameDevice for TulipDevice {
    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        MTU
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { checksummed: true, needs_pinning: true, reorders: false, serves_peers: false }
    }

    fn wait_fd(&self) -> RawFd {
        self.irq_fd
    }

    fn rx_ring_frames(&self) -> Option<usize> {
        Some(RX_RING)
    }

    fn set_filter(&mut self, filter: RxFilter) -> io::Result<()> {
        self.filter = Some(filter);
        Ok(())
    }

    fn receive(&mut self, budget: usize, sink: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let i = self.rx_next;
            let st = self.desc_status(RX_RING_OFF, i);
            if st & OWN != 0 {
                break;
            }
            let off = RX_BUF_OFF + i * BUF;
            match desc::rx_done(st, RX_BUF_LEN) {
                RxDone::Frame(len) => {
                    // SAFETY: the NIC released the buffer (OWN clear, read
                    // with acquire); `len` <= RX_BUF_LEN <= BUF is checked.
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
            self.put_desc(RX_RING_OFF, i, desc::rx_ready(self.iova_of(off), RX_BUF_LEN, i == RX_RING - 1));
            self.rx_next = (i + 1) % RX_RING;
        }
        // A ring that filled stopped the receive process (RU), which a
        // spinning receiver takes no interrupt to learn: after a quarter
        // ring of frames without the ring seen empty, look (two CSR
        // accesses). A full ring means a whole ring of them, so at least
        // one look falls after the stop.
        self.since_empty += n;
        if self.since_empty >= RX_RING / 4 {
            self.since_empty = 0;
            self.acknowledge();
        }
        if n < budget {
            self.since_empty = 0;
        }
        Ok(n)
    }

    fn transmit(&mut self, frames: &[TxFrame<'_>]) -> io::Result<usize> {
        self.reclaim();
        let max = ETH_HEADER + MTU;
        let mut sent = 0;
        let mut wait_for: Option<usize> = None;
        for f in frames {
            let len = f.len();
            if !(ETH_HEADER..=max).contains(&len) || f.header.len() > desc::MAX_BUFFER {
                if sent > 0 {
                    break;
                }
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("frame of {len} bytes; the tulip sends {ETH_HEADER}..={max} (MTU {MTU})")));
            }
            if self.tx_busy == TX_RING - 1 {
                self.counters.tx_ring_full += 1;
                break;
            }
            let i = self.tx_next;
            let off = TX_BUF_OFF + i * BUF;
            let h = f.header.len();
            // SAFETY: the header fits the slot's BUF bytes (checked above).
            unsafe { std::ptr::copy_nonoverlapping(f.header.as_ptr(), self.mem.at(off), h) };
            let direct = match f.pieces() {
                [p] if !p.is_empty() => self.translate(p.as_ptr() as usize, p.len()).map(|iova| (iova, p.len())),
                _ => None,
            };
            let d = match direct {
                Some((iova, plen)) => {
                    self.counters.tx_zero_copy += 1;
                    wait_for = Some(i);
                    desc::tx_frame(self.iova_of(off), h, iova, plen, i == TX_RING - 1)
                }
                None => {
                    let mut at = h;
                    for p in f.pieces() {
                        // SAFETY: the whole frame fits BUF (len <= 1514 < BUF).
                        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.mem.at(off + at), p.len()) };
                        at += p.len();
                    }
                    self.counters.tx_copied += u64::from(f.pieces > 0);
                    desc::tx_frame(self.iova_of(off), len, 0, 0, i == TX_RING - 1)
                }
            };
            self.put_desc(TX_RING_OFF, i, d);
            self.tx_next = (i + 1) % TX_RING;
            self.tx_busy += 1;
            sent += 1;
        }
        if sent > 0 {
            // The doorbell: transmit poll demand.
            self.write_csr(regs::TX_POLL, 1);
            self.counters.tx_frames += sent as u64;
        }
        if let Some(i) = wait_for {
            // User memory must not be reused before the NIC has read it.
            if !spin_until(NIC_TIMEOUT, || self.desc_status(TX_RING_OFF, i) & OWN == 0) {
                return Err(io::Error::other(format!("{}: the NIC did not send within {NIC_TIMEOUT:?}", self.address)));
            }
            self.reclaim();
        }
        Ok(sent)
    }

    fn map_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.iommu.map(&self.vfio, addr, len, "tulip")
    }

    fn unmap_memory(&mut self, addr: usize, len: usize) -> io::Result<()> {
        self.iommu.unmap(&self.vfio, addr, len, "tulip")
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        self.counters.stats(self.iommu.user_count())
    }

    fn prepare_sleep(&mut self) -> Option<Sleep> {
        self.rearm_interrupt();
        // A frame that landed before the acknowledgement above raised no
        // interrupt the sleeper will see: take it instead of sleeping.
        (!self.frame_waiting()).then(Sleep::default)
    }

    /// Is a frame there? The next receive descriptor's RDES0 says: the NIC
    /// clears its OWN bit once it wrote a frame there (§4.2.1). One load of
    /// our memory, so a poll that finds nothing complete skips its round
    /// of progress. (The tulip reports no watched word for waits to spin
    /// on, `rx_watch`: under TCG that held back the rounds that also tend
    /// the NIC, DESIGN-NOTES "Tried and dropped (2026-11-26)"; its waits
    /// look in rounds.)
    fn rx_pending(&self) -> Option<bool> {
        Some(self.frame_waiting())
    }
}

impl Drop for TulipDevice {
    /// Stops the NIC before its memory goes: interrupts off, receive and
    /// transmit off, software reset; then every DMA mapping is removed.
    /// (If the process dies instead, closing the VFIO files makes the kernel
    /// disable bus mastering and drop the container's mappings; the next
    /// open resets the NIC before it turns bus mastering on again.)
    fn drop(&mut self) {
        self.write_csr(regs::INT_ENABLE, 0);
        self.write_csr(regs::OP_MODE, 0);
        self.write_csr(regs::BUS_MODE, regs::BUS_MODE_SWR);
        self.iommu.clear(&self.vfio);
        let _ = pci_cmd::stop_mastering(&self.vfio);
    }
}
