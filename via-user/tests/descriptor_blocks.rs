//! The Rust API's descriptors share registrations: many descriptors of
//! one size and tag are one registered block, not one registration each
//! (on a VFIO NIC each registration is an IOMMU mapping). Over the
//! in-process loopback device; no root needed.

use std::collections::HashSet;
use via_user::{Descriptor, MemAttributes, MemoryRegion, Nic};
// The software drivers (loopback devices), registered by linking them.
use via_softnic as _;

fn nic(name: &str) -> Nic {
    Nic::open(&format!("loop:blocks-{name}-{}", std::process::id())).unwrap()
}

#[test]
fn many_descriptors_share_few_registrations() {
    let nic = nic("share");
    let ptag = nic.create_ptag().unwrap();
    let ds: Vec<Descriptor> = (0..300).map(|_| Descriptor::new(&nic, ptag, 1).unwrap()).collect();
    let addrs: HashSet<usize> = ds.iter().map(Descriptor::addr).collect();
    assert_eq!(addrs.len(), ds.len(), "every descriptor has memory of its own");
    assert!(ds.iter().all(|d| d.addr() % via_user::descriptor::DESCRIPTOR_ALIGNMENT == 0), "descriptors are aligned");
    let handles: HashSet<u32> = ds.iter().map(Descriptor::handle).collect();
    assert!(handles.len() <= 3, "300 descriptors took {} registrations", handles.len());
    // Another protection tag is another registration.
    let other = nic.create_ptag().unwrap();
    let d = Descriptor::new(&nic, other, 1).unwrap();
    assert!(!handles.contains(&d.handle()), "a descriptor under another tag shares a registration with the first tag's");
}

#[test]
fn a_block_goes_with_its_last_descriptor() {
    let nic = nic("last");
    let ptag = nic.create_ptag().unwrap();
    let first = Descriptor::new(&nic, ptag, 1).unwrap();
    let (start, handle) = (first.addr(), first.handle());
    // The block's first descriptor starts its registered region.
    nic.raw().query_mem(start, handle).expect("the block is registered");
    let second = Descriptor::new(&nic, ptag, 1).unwrap();
    assert_eq!(second.handle(), handle);
    drop(first);
    nic.raw().query_mem(start, handle).expect("the block stays while a descriptor of it lives");
    drop(second);
    assert!(nic.raw().query_mem(start, handle).is_err(), "the block is deregistered once its last descriptor is dropped");
    // And a new descriptor works on a new block.
    let third = Descriptor::new(&nic, ptag, 1).unwrap();
    assert_eq!(third.status(), 0);
}

#[test]
fn a_reused_slot_starts_blank() {
    let nic = nic("blank");
    let ptag = nic.create_ptag().unwrap();
    let buf = MemoryRegion::new(&nic, 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    let keep = Descriptor::new(&nic, ptag, 1).unwrap(); // keeps the block alive
    let mut used = Descriptor::new(&nic, ptag, 1).unwrap();
    used.set(&[(&buf, 0..100)], Some(7)).unwrap();
    let addr = used.addr();
    drop(used);
    let fresh = Descriptor::new(&nic, ptag, 1).unwrap();
    assert_eq!(fresh.addr(), addr, "the freed slot is taken again");
    assert_eq!((fresh.control(), fresh.length(), fresh.status(), fresh.immediate_data_sent()), (0, 0, 0, 0), "what the last user wrote is gone");
    drop(keep);
}
