//! The drivers libvipl carries: the software NICs (loopback, AF_PACKET,
//! shared memory, composites), the tulip and the 82574 (e1000e) over VFIO. Each registers
//! itself in via-device's opener table; this module only keeps them linked.

use std::hint::black_box;

/// Names each driver crate's registration. A Rust or shared-library link
/// keeps them anyway; a C program linking `libvipl.a` takes only the
/// archive members something refers to, and would otherwise open no
/// device at all. `VipOpenNic` calls it.
pub(crate) fn keep_linked() {
    black_box(&via_softnic::SOFTNIC_DRIVERS);
    black_box(&via_nic_tulip::TULIP_DRIVERS);
    black_box(&via_nic_e1000e::E1000E_DRIVERS);
}
