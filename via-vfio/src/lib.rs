//! What VIA's user-space NIC drivers share, whatever the NIC: a device
//! owned through VFIO, the DMA memory of its rings, the IOMMU mappings of
//! registered memory, and access to its registers.
//!
//! | module      | owns                                                          |
//! |-------------|---------------------------------------------------------------|
//! | [`device`]  | the VFIO container, group, device, DMA mappings, INTx eventfd |
//! | [`dma`]     | DMA memory and the 32-bit IOVA space                          |
//! | [`mmio`]    | a BAR's registers: mapped, or through the VFIO region         |
//! | [`mapped`]  | registered memory mapped into the IOMMU, and translation      |
//! | [`pci_cmd`] | the PCI command register: decoding and bus mastering          |
//! | [`nic`]     | a driver's counters, and its bounded spin on the NIC          |
//!
//! A driver (via-nic-tulip, via-nic-e1000e) keeps what is its NIC's alone:
//! registers, descriptors, bring-up and teardown.

pub mod device;
pub mod dma;
pub mod mapped;
pub mod mmio;
pub mod nic;
pub mod pci_cmd;

pub use device::{Region, VfioDevice};
pub use dma::{page_span, DmaMemory, IovaSpace, PAGE};
pub use mapped::IommuMappings;
pub use mmio::Registers;
pub use nic::{spin_until, NicCounters};
