//! Memory the NIC may reach: the driver's own DMA block and registered
//! user memory, each mapped into the device's IOMMU domain at an IOVA of
//! the 32-bit window, and the translation of a payload's address into the
//! bus address a descriptor carries.
//!
//! VFIO pins what is mapped and charges it to `RLIMIT_MEMLOCK`; a mapping
//! refused for that names the limit (`via_device::memlock`).

use crate::device::VfioDevice;
use crate::dma::{page_span, DmaMemory, IovaSpace};
use std::io;
use via_device::memlock::explain_pin_error;

/// Registered memory mapped for the NIC.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    /// What the caller registered.
    addr: usize,
    len: usize,
    /// The whole pages mapped for it, and where.
    start: usize,
    size: usize,
    iova: u64,
}

/// The IOMMU mappings of one device.
#[derive(Debug, Default)]
pub struct IommuMappings {
    iovas: IovaSpace,
    /// Registered memory, in mapping order (translation looks newest first).
    user: Vec<Mapping>,
    /// The driver's DMA block: (iova, size).
    own: Option<(u64, usize)>,
}

impl IommuMappings {
    /// Maps the driver's DMA block (rings and buffers); returns its IOVA.
    pub fn map_own(&mut self, vfio: &VfioDevice, mem: &DmaMemory) -> io::Result<u64> {
        let iova = self.iovas.alloc(mem.len() as u64).ok_or_else(|| io::Error::other("no IOVA space for the rings"))?;
        if let Err(e) = vfio.map_dma(mem.addr(), iova, mem.len()) {
            self.iovas.release(iova, mem.len() as u64);
            return Err(explain_pin_error(e, mem.len(), "the NIC's rings and buffers"));
        }
        self.own = Some((iova, mem.len()));
        Ok(iova)
    }

    /// Maps registered memory `[addr, addr + len)` (whole pages); `nic`
    /// names the NIC in errors.
    pub fn map(&mut self, vfio: &VfioDevice, addr: usize, len: usize, nic: &str) -> io::Result<()> {
        let (start, size) = page_span(addr, len);
        let iova = self.iovas.alloc(size as u64).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, format!("the {nic}'s 32-bit bus address space is full ({} bytes registered)", self.user.iter().map(|m| m.size).sum::<usize>()))
        })?;
        if let Err(e) = vfio.map_dma(start, iova, size) {
            self.iovas.release(iova, size as u64);
            return Err(explain_pin_error(e, size, "the NIC"));
        }
        self.user.push(Mapping { addr, len, start, size, iova });
        Ok(())
    }

    /// Removes the mapping [`IommuMappings::map`] made for `[addr, addr + len)`.
    pub fn unmap(&mut self, vfio: &VfioDevice, addr: usize, len: usize, nic: &str) -> io::Result<()> {
        let Some(k) = self.user.iter().rposition(|m| m.addr == addr && m.len == len) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{addr:#x}+{len} is not mapped for the {nic}")));
        };
        let m = self.user.remove(k);
        vfio.unmap_dma(m.iova, m.size)?;
        self.iovas.release(m.iova, m.size as u64);
        Ok(())
    }

    /// The bus address of `[addr, addr + len)` when it lies inside one
    /// mapping of registered memory.
    #[inline]
    pub fn translate(&self, addr: usize, len: usize) -> Option<u64> {
        let m = self.user.iter().rev().find(|m| addr >= m.start && addr + len <= m.start + m.size)?;
        Some(m.iova + (addr - m.start) as u64)
    }

    /// How many registered regions are mapped.
    pub fn user_count(&self) -> usize {
        self.user.len()
    }

    /// Removes every mapping, the driver's block included (teardown, once
    /// the NIC is stopped).
    pub fn clear(&mut self, vfio: &VfioDevice) {
        for m in std::mem::take(&mut self.user) {
            let _ = vfio.unmap_dma(m.iova, m.size);
            self.iovas.release(m.iova, m.size as u64);
        }
        if let Some((iova, size)) = self.own.take() {
            let _ = vfio.unmap_dma(iova, size);
            self.iovas.release(iova, size as u64);
        }
    }
}
