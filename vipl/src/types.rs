//! The `vipl.h` types, `#[repr(C)]`, in the field order and with the
//! values of VIA 1.0 (x86_64 Linux, LP64: `VIP_ULONG` is 8 bytes,
//! `VIP_BOOLEAN` an `int`). Sizes and offsets are asserted below and, from
//! C, by `tests/c/layout.c` against `include/vipl.h`.

use std::os::raw::{c_char, c_int, c_ulong, c_void};

pub type VipReturnCode = c_int;
pub type VipBoolean = c_int;
pub type VipPvoid = *mut c_void;
pub type VipHandle = *mut c_void;
pub type VipMemHandle = u32;
pub type VipReliabilityLevel = u16;

pub const VIP_TRUE: VipBoolean = 1;
pub const VIP_FALSE: VipBoolean = 0;
/// `VIP_INFINITE`: all ones.
pub const VIP_INFINITE: c_ulong = !0;
pub const VIP_SMI_AUTODISCOVERY: c_ulong = 1;

/// `VIP_NIC_ATTRIBUTES`.
#[repr(C)]
pub struct VipNicAttributes {
    pub name: [c_char; 64],
    pub hardware_version: c_ulong,
    pub provider_version: c_ulong,
    pub nic_address_len: u16,
    pub local_nic_address: *const u8,
    pub thread_safe: VipBoolean,
    pub max_discriminator_len: u16,
    pub max_register_bytes: c_ulong,
    pub max_register_regions: c_ulong,
    pub max_register_block_bytes: c_ulong,
    pub max_vi: c_ulong,
    pub max_descriptors_per_queue: c_ulong,
    pub max_segments_per_desc: c_ulong,
    pub max_cq: c_ulong,
    pub max_cq_entries: c_ulong,
    pub max_transfer_size: c_ulong,
    pub native_mtu: c_ulong,
    pub max_ptags: c_ulong,
    pub reliability_level_support: VipReliabilityLevel,
    pub rdma_read_support: VipReliabilityLevel,
}

/// `VIP_VI_ATTRIBUTES`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VipViAttributes {
    pub reliability_level: VipReliabilityLevel,
    pub max_transfer_size: c_ulong,
    pub qos: VipPvoid,
    pub ptag: VipHandle,
    pub enable_rdma_write: VipBoolean,
    pub enable_rdma_read: VipBoolean,
}

/// `VIP_MEM_ATTRIBUTES`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VipMemAttributes {
    pub ptag: VipHandle,
    pub enable_rdma_write: VipBoolean,
    pub enable_rdma_read: VipBoolean,
}

/// `VIP_NET_ADDRESS`: variable length; `host_address` is followed by
/// `HostAddressLen` address bytes, then `DiscriminatorLen` discriminator
/// bytes, in memory the caller allocated.
#[repr(C)]
pub struct VipNetAddress {
    pub host_address_len: u16,
    pub discriminator_len: u16,
    pub host_address: [u8; 1],
}

/// `VIP_VI_STATE`.
pub mod vi_state {
    pub const IDLE: i32 = 0;
    pub const CONNECTED: i32 = 1;
    pub const CONNECT_PENDING: i32 = 2;
    pub const ERROR: i32 = 3;
}

/// `VIP_ERROR_CODE`.
pub mod error_code {
    pub const POST_DESC: i32 = 0;
    pub const CONN_LOST: i32 = 1;
    pub const RECVQ_EMPTY: i32 = 2;
    pub const VI_OVERRUN: i32 = 3;
    pub const RDMAW_PROT: i32 = 4;
    pub const RDMAW_DATA: i32 = 5;
    pub const RDMAW_ABORT: i32 = 6;
    pub const RDMAR_PROT: i32 = 7;
    pub const COMP_PROT: i32 = 8;
    pub const RDMA_TRANSPORT: i32 = 9;
    pub const CATASTROPHIC: i32 = 10;
}

/// `VIP_RESOURCE_CODE`.
pub mod resource_code {
    pub const NIC: i32 = 0;
    pub const VI: i32 = 1;
    pub const CQ: i32 = 2;
    pub const DESCRIPTOR: i32 = 3;
}

/// `VIP_ERROR_DESCRIPTOR`.
#[repr(C)]
pub struct VipErrorDescriptor {
    pub nic_handle: VipHandle,
    pub vi_handle: VipHandle,
    pub cq_handle: VipHandle,
    pub descriptor_ptr: *mut c_void,
    pub op_code: c_ulong,
    pub resource_code: c_int,
    pub error_code: c_int,
}

/// `VIP_AUTODISCOVERY_LIST`.
#[repr(C)]
pub struct VipAutodiscoveryList {
    pub number_of_hops: c_ulong,
    pub ad_addr_array: *mut *mut VipNetAddress,
    pub num_ad_addrs: c_ulong,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_vipl_h() {
        assert_eq!(size_of::<VipNicAttributes>(), 200);
        assert_eq!(offset_of!(VipNicAttributes, hardware_version), 64);
        assert_eq!(offset_of!(VipNicAttributes, nic_address_len), 80);
        assert_eq!(offset_of!(VipNicAttributes, local_nic_address), 88);
        assert_eq!(offset_of!(VipNicAttributes, thread_safe), 96);
        assert_eq!(offset_of!(VipNicAttributes, max_discriminator_len), 100);
        assert_eq!(offset_of!(VipNicAttributes, max_register_bytes), 104);
        assert_eq!(offset_of!(VipNicAttributes, max_ptags), 184);
        assert_eq!(offset_of!(VipNicAttributes, reliability_level_support), 192);
        assert_eq!(offset_of!(VipNicAttributes, rdma_read_support), 194);
        assert_eq!(size_of::<VipViAttributes>(), 40);
        assert_eq!(offset_of!(VipViAttributes, max_transfer_size), 8);
        assert_eq!(offset_of!(VipViAttributes, qos), 16);
        assert_eq!(offset_of!(VipViAttributes, ptag), 24);
        assert_eq!(offset_of!(VipViAttributes, enable_rdma_write), 32);
        assert_eq!(offset_of!(VipViAttributes, enable_rdma_read), 36);
        assert_eq!(size_of::<VipMemAttributes>(), 16);
        assert_eq!(offset_of!(VipMemAttributes, enable_rdma_read), 12);
        assert_eq!(offset_of!(VipNetAddress, host_address), 4);
        assert_eq!(size_of::<VipErrorDescriptor>(), 48);
        assert_eq!(offset_of!(VipErrorDescriptor, op_code), 32);
        assert_eq!(offset_of!(VipErrorDescriptor, resource_code), 40);
        assert_eq!(offset_of!(VipErrorDescriptor, error_code), 44);
        assert_eq!(size_of::<VipAutodiscoveryList>(), 24);
        // The descriptor layout is via-user's, asserted there.
        assert_eq!(size_of::<via_user::descriptor::Descriptor>(), 64);
    }
}
