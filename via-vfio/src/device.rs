//! The VFIO calls the drivers need, and nothing else: a type-1 IOMMU
//! container, the device's group, the device itself (regions, reset, INTx
//! through an eventfd) and DMA mappings.
//!
//! Interface: `linux/vfio.h` (Documentation/driver-api/vfio.rst). Every
//! ioctl is `_IO(';', 100 + n)`; structures start with `argsz`. All `unsafe`
//! of the drivers that is not MMIO or DMA memory lives here, each with its
//! `SAFETY:` note.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use via_device::EventFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

const VFIO_TYPE: u64 = b';' as u64;
const fn io_nr(nr: u64) -> u64 {
    (VFIO_TYPE << 8) | (100 + nr)
}
const GET_API_VERSION: u64 = io_nr(0);
const CHECK_EXTENSION: u64 = io_nr(1);
const SET_IOMMU: u64 = io_nr(2);
const GROUP_GET_STATUS: u64 = io_nr(3);
const GROUP_SET_CONTAINER: u64 = io_nr(4);
const GROUP_GET_DEVICE_FD: u64 = io_nr(6);
const DEVICE_GET_REGION_INFO: u64 = io_nr(8);
const DEVICE_SET_IRQS: u64 = io_nr(10);
const DEVICE_RESET: u64 = io_nr(11);
const IOMMU_MAP_DMA: u64 = io_nr(13);
const IOMMU_UNMAP_DMA: u64 = io_nr(14);

const API_VERSION: i32 = 0;
const TYPE1_IOMMU: u64 = 1;
const GROUP_FLAGS_VIABLE: u32 = 1;
const REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
const IRQ_SET_DATA_NONE: u32 = 1 << 0;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const DMA_MAP_FLAG_READ: u32 = 1;
const DMA_MAP_FLAG_WRITE: u32 = 2;
/// `VFIO_PCI_INTX_IRQ_INDEX`.
const INTX: u32 = 0;
/// `VFIO_PCI_CONFIG_REGION_INDEX`.
pub const CONFIG_REGION: u32 = 7;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RegionInfoRaw {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct IrqSet<const N: usize> {
    argsz: u32,
    flags: u32,
    index: u32,
    start: u32,
    count: u32,
    data: [i32; N],
}

// The layouts linux/vfio.h gives (struct vfio_group_status,
// vfio_region_info, vfio_iommu_type1_dma_map and _unmap, vfio_irq_set).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<GroupStatus>() == 8);
    assert!(size_of::<RegionInfoRaw>() == 32 && offset_of!(RegionInfoRaw, size) == 16 && offset_of!(RegionInfoRaw, offset) == 24);
    assert!(size_of::<DmaMap>() == 32 && offset_of!(DmaMap, vaddr) == 8 && offset_of!(DmaMap, iova) == 16 && offset_of!(DmaMap, size) == 24);
    assert!(size_of::<DmaUnmap>() == 24 && offset_of!(DmaUnmap, iova) == 8 && offset_of!(DmaUnmap, size) == 16);
    assert!(size_of::<IrqSet<0>>() == 20 && offset_of!(IrqSet<1>, data) == 20 && size_of::<IrqSet<1>>() == 24);
};

/// The ioctl system call on a VFIO descriptor; errors name the request
/// (`what`).
///
/// # Safety
/// `req` is a request number from linux/vfio.h and `arg` what that request
/// takes: a pointer to a live `repr(C)` struct of the layout the header
/// gives (the asserts above), a NUL-terminated string, or an integer or
/// null cast to a pointer.
unsafe fn ioctl(fd: RawFd, req: u64, arg: *mut libc::c_void, what: &str) -> io::Result<i32> {
    // SAFETY: the caller's promise (see above).
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// A region of the device (a BAR or PCI config space).
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub index: u32,
    pub size: u64,
    /// Where the region lies in the device file.
    pub offset: u64,
    pub mmap: bool,
}

/// An opened VFIO device with its own container (one IOMMU domain).
pub struct VfioDevice {
    // Field order is drop order: device before group before container.
    device: File,
    _group: File,
    container: File,
    irq: Option<EventFd>,
}

impl VfioDevice {
    /// Opens the PCI device `address` (e.g. `0000:00:03.0`), which must be
    /// bound to vfio-pci, in a new type-1 container.
    pub fn open(address: &str) -> io::Result<VfioDevice> {
        let group_link = Path::new("/sys/bus/pci/devices").join(address).join("iommu_group");
        let group = std::fs::read_link(&group_link).map_err(|e| {
            if Path::new("/sys/bus/pci/devices").join(address).exists() {
                io::Error::new(io::ErrorKind::NotFound, format!("{address} has no IOMMU group ({e}): is the IOMMU on? (intel_iommu=on or amd_iommu=on on the kernel command line)"))
            } else {
                io::Error::new(io::ErrorKind::NotFound, format!("no PCI device {address} (see `via-agent list`)"))
            }
        })?;
        let group = group.file_name().and_then(|g| g.to_str()).unwrap_or_default().to_string();
        let rw = |p: &str| OpenOptions::new().read(true).write(true).open(p);
        let container = rw("/dev/vfio/vfio").map_err(|e| io::Error::new(e.kind(), format!("opening /dev/vfio/vfio: {e} (is the vfio module loaded? `modprobe vfio-pci`)")))?;
        let group_path = format!("/dev/vfio/{group}");
        let group_file = rw(&group_path).map_err(|e| {
            io::Error::new(e.kind(), format!("opening {group_path}: {e} (bind the device first: `via-agent bind {address}`; if it is bound, another process may own it)"))
        })?;
        let cfd = container.as_raw_fd();
        // SAFETY: VFIO_GET_API_VERSION takes no argument.
        if unsafe { ioctl(cfd, GET_API_VERSION, std::ptr::null_mut(), "VFIO_GET_API_VERSION") }? != API_VERSION {
            return Err(io::Error::other("unknown VFIO API version"));
        }
        // SAFETY: VFIO_CHECK_EXTENSION takes an integer argument.
        if unsafe { ioctl(cfd, CHECK_EXTENSION, TYPE1_IOMMU as *mut libc::c_void, "VFIO_CHECK_EXTENSION") }? != 1 {
            return Err(io::Error::other("the VFIO container does not support the type-1 IOMMU"));
        }
        let mut status = GroupStatus { argsz: std::mem::size_of::<GroupStatus>() as u32, flags: 0 };
        // SAFETY: VFIO_GROUP_GET_STATUS takes a pointer to a live `GroupStatus`, which `status` is.
        unsafe { ioctl(group_file.as_raw_fd(), GROUP_GET_STATUS, (&mut status as *mut GroupStatus).cast(), "VFIO_GROUP_GET_STATUS") }?;
        if status.flags & GROUP_FLAGS_VIABLE == 0 {
            return Err(io::Error::other(format!(
                "IOMMU group {group} is not viable: another device in it is still bound to a kernel driver (`via-agent status` shows the group)"
            )));
        }
        let mut cfd_arg: i32 = cfd;
        // SAFETY: VFIO_GROUP_SET_CONTAINER takes a pointer to a live `i32`, which `cfd_arg` is.
        unsafe { ioctl(group_file.as_raw_fd(), GROUP_SET_CONTAINER, (&mut cfd_arg as *mut i32).cast(), "VFIO_GROUP_SET_CONTAINER") }?;
        // SAFETY: VFIO_SET_IOMMU takes an integer argument.
        unsafe { ioctl(cfd, SET_IOMMU, TYPE1_IOMMU as *mut libc::c_void, "VFIO_SET_IOMMU") }?;
        let name = CString::new(address).map_err(|_| io::Error::other("PCI address contains NUL"))?;
        // SAFETY: VFIO_GROUP_GET_DEVICE_FD takes a NUL-terminated string, which `name` (a CString) is.
        let dfd = unsafe { ioctl(group_file.as_raw_fd(), GROUP_GET_DEVICE_FD, name.as_ptr() as *mut libc::c_void, "VFIO_GROUP_GET_DEVICE_FD") }?;
        // SAFETY: the ioctl returned a new file descriptor that we now own.
        let device = unsafe { File::from_raw_fd(dfd) };
        Ok(VfioDevice { device, _group: group_file, container, irq: None })
    }

    /// A second descriptor of the device file (for register access through
    /// the region, beside this value).
    pub fn try_clone_file(&self) -> io::Result<File> {
        self.device.try_clone()
    }

    /// Describes region `index` (BAR n is index n).
    pub fn region(&self, index: u32) -> io::Result<Region> {
        let mut info = RegionInfoRaw { argsz: std::mem::size_of::<RegionInfoRaw>() as u32, index, ..Default::default() };
        // SAFETY: VFIO_DEVICE_GET_REGION_INFO takes a pointer to a live `RegionInfoRaw`, which `info` is.
        unsafe { ioctl(self.device.as_raw_fd(), DEVICE_GET_REGION_INFO, (&mut info as *mut RegionInfoRaw).cast(), "VFIO_DEVICE_GET_REGION_INFO") }?;
        Ok(Region { index, size: info.size, offset: info.offset, mmap: info.flags & REGION_INFO_FLAG_MMAP != 0 })
    }

    /// Reads a 16-bit value of PCI config space.
    pub fn config_read16(&self, off: u64) -> io::Result<u16> {
        let r = self.region(CONFIG_REGION)?;
        let mut b = [0u8; 2];
        self.device.read_exact_at(&mut b, r.offset + off)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Writes a 16-bit value of PCI config space.
    pub fn config_write16(&self, off: u64, v: u16) -> io::Result<()> {
        let r = self.region(CONFIG_REGION)?;
        self.device.write_all_at(&v.to_le_bytes(), r.offset + off)
    }

    /// Maps `region` (when VFIO allows it) and returns the mapping's base.
    pub fn mmap_region(&self, region: &Region) -> io::Result<*mut u8> {
        if !region.mmap {
            return Err(io::Error::other("region cannot be mmapped"));
        }
        // SAFETY: a shared mapping of the device file at the region's
        // offset, of the region's size, as VFIO documents; checked below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), region.size as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, self.device.as_raw_fd(), region.offset as libc::off_t)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(p.cast())
    }

    /// Function-level reset when the device supports one.
    pub fn reset(&self) -> io::Result<()> {
        // SAFETY: VFIO_DEVICE_RESET takes no argument.
        unsafe { ioctl(self.device.as_raw_fd(), DEVICE_RESET, std::ptr::null_mut(), "VFIO_DEVICE_RESET") }.map(|_| ())
    }

    /// Makes `[vaddr, vaddr + size)` reachable by the device at `iova`.
    pub fn map_dma(&self, vaddr: usize, iova: u64, size: usize) -> io::Result<()> {
        let mut m = DmaMap { argsz: std::mem::size_of::<DmaMap>() as u32, flags: DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE, vaddr: vaddr as u64, iova, size: size as u64 };
        // SAFETY: VFIO_IOMMU_MAP_DMA takes a pointer to a live `DmaMap`, which `m` is.
        unsafe { ioctl(self.container.as_raw_fd(), IOMMU_MAP_DMA, (&mut m as *mut DmaMap).cast(), "VFIO_IOMMU_MAP_DMA") }.map(|_| ())
    }

    /// Removes the mapping at `iova`.
    pub fn unmap_dma(&self, iova: u64, size: usize) -> io::Result<()> {
        let mut m = DmaUnmap { argsz: std::mem::size_of::<DmaUnmap>() as u32, flags: 0, iova, size: size as u64 };
        // SAFETY: VFIO_IOMMU_UNMAP_DMA takes a pointer to a live `DmaUnmap`, which `m` is.
        unsafe { ioctl(self.container.as_raw_fd(), IOMMU_UNMAP_DMA, (&mut m as *mut DmaUnmap).cast(), "VFIO_IOMMU_UNMAP_DMA") }.map(|_| ())
    }

    /// Routes INTx to a new eventfd and returns it (non-blocking).
    pub fn enable_intx(&mut self) -> io::Result<RawFd> {
        let owned = EventFd::new()?;
        let efd = owned.as_raw_fd();
        let mut set = IrqSet::<1> { argsz: std::mem::size_of::<IrqSet<1>>() as u32, flags: IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER, index: INTX, start: 0, count: 1, data: [efd] };
        // SAFETY: VFIO_DEVICE_SET_IRQS takes a pointer to a live `IrqSet<1>`, which `set` is.
        unsafe { ioctl(self.device.as_raw_fd(), DEVICE_SET_IRQS, (&mut set as *mut IrqSet<1>).cast(), "VFIO_DEVICE_SET_IRQS (INTx eventfd)") }?;
        self.irq = Some(owned);
        Ok(efd)
    }

    /// Unmasks INTx after an interrupt (VFIO masks it when it fires).
    pub fn unmask_intx(&self) -> io::Result<()> {
        let mut set = IrqSet::<0> { argsz: std::mem::size_of::<IrqSet<0>>() as u32, flags: IRQ_SET_DATA_NONE | IRQ_SET_ACTION_UNMASK, index: INTX, start: 0, count: 1, data: [] };
        // SAFETY: VFIO_DEVICE_SET_IRQS takes a pointer to a live `IrqSet<0>`, which `set` is.
        unsafe { ioctl(self.device.as_raw_fd(), DEVICE_SET_IRQS, (&mut set as *mut IrqSet<0>).cast(), "VFIO_DEVICE_SET_IRQS (unmask)") }.map(|_| ())
    }

    /// Makes the interrupt eventfd readable without an interrupt (a wake-up
    /// for a sleeper that would otherwise miss work already there).
    pub fn signal(&self) {
        if let Some(fd) = self.irq.as_ref() {
            fd.signal();
        }
    }

    /// Consumes pending interrupt signals; true when there were any.
    pub fn take_interrupt(&self) -> bool {
        self.irq.as_ref().is_some_and(|fd| fd.drain() > 0)
    }
}
