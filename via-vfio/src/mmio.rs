//! A BAR's 32-bit registers, as a driver reaches them: through a mapping
//! of the BAR into our address space, or, when VFIO cannot map it (a BAR
//! smaller than a page that does not start on a page boundary, such as the
//! 2114x's 128 bytes), through reads and writes of the VFIO region.

use crate::device::{Region, VfioDevice};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The registers of one BAR.
pub struct Registers {
    access: Access,
    len: u64,
}

enum Access {
    Mapped(*mut u8),
    /// The device file (a duplicate descriptor) and where the BAR lies in it.
    Region(File, Region),
}

// SAFETY: the mapping belongs to this value, which the driver uses from
// one thread at a time (every write goes through `&self` of a device that
// is only reached through `&mut`); MMIO has no thread affinity.
unsafe impl Send for Registers {}

impl Registers {
    /// The registers of `region` (a BAR) of `vfio`: mapped when VFIO allows
    /// it, else through the region.
    pub fn new(vfio: &VfioDevice, region: Region) -> io::Result<Registers> {
        let access = match vfio.mmap_region(&region) {
            Ok(base) => Access::Mapped(base),
            Err(_) => Access::Region(vfio.try_clone_file()?, region),
        };
        Ok(Registers { access, len: region.size })
    }

    /// Whether the BAR is mapped (each access a plain load or store).
    pub fn is_mapped(&self) -> bool {
        matches!(self.access, Access::Mapped(_))
    }

    /// The register at byte offset `off` (a multiple of 4 inside the BAR;
    /// all ones when a region read fails, as a vanished PCI device reads).
    #[inline]
    pub fn read(&self, off: u64) -> u32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.len, "register {off:#x} outside the {}-byte BAR", self.len);
        match &self.access {
            // SAFETY: in bounds of the mapped BAR and 4-byte aligned
            // (asserted); MMIO needs a volatile access.
            Access::Mapped(base) => u32::from_le(unsafe { std::ptr::read_volatile(base.add(off as usize).cast::<u32>()) }),
            Access::Region(f, r) => {
                let mut b = [0u8; 4];
                f.read_exact_at(&mut b, r.offset + off).map(|_| u32::from_le_bytes(b)).unwrap_or(u32::MAX)
            }
        }
    }

    /// Writes the register at byte offset `off` (as in [`Registers::read`]).
    #[inline]
    pub fn write(&self, off: u64, v: u32) {
        assert!(off.is_multiple_of(4) && off + 4 <= self.len, "register {off:#x} outside the {}-byte BAR", self.len);
        match &self.access {
            // SAFETY: as in `read`.
            Access::Mapped(base) => unsafe { std::ptr::write_volatile(base.add(off as usize).cast::<u32>(), v.to_le()) },
            Access::Region(f, r) => {
                let _ = f.write_all_at(&v.to_le_bytes(), r.offset + off);
            }
        }
    }
}

impl Drop for Registers {
    fn drop(&mut self) {
        if let Access::Mapped(base) = self.access {
            // SAFETY: unmaps exactly the BAR mapping made in `new`.
            unsafe { libc::munmap(base.cast(), self.len as usize) };
        }
    }
}
