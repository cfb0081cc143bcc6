//! via-user: the VIA 1.0 VI Provider Library.
//!
//! VIs with send and receive work queues, doorbells and completion queues,
//! run by the VI protocol engine (framing, fragmentation, reliability) on a
//! frame device opened by name. The Rust API:
//!
//! ```no_run
//! use via_user::{Nic, ViAttributes, Reliability, MemoryRegion, Descriptor};
//! use via_kernel_agent::memory::MemAttributes;
//! let nic = Nic::open("/dev/via_veth0")?;
//! let ptag = nic.create_ptag()?;
//! let attrs = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 20,
//!                            ptag, enable_rdma_write: false, enable_rdma_read: false };
//! let mut vi = nic.create_vi(&attrs, None, None)?;
//! let buf = MemoryRegion::new(&nic, 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false })?;
//! let mut d = Descriptor::new(&nic, ptag, 1)?;
//! d.set(&[(&buf, 0..4096)], None)?;
//! vi.post_recv(d)?;
//! vi.connect(nic.lookup_host("server")?, b"service", None)?;
//! let got = vi.recv_wait(None)?;
//! got.check_ok()?;
//! # Ok::<(), via_user::ViaError>(())
//! ```
//!
//! Modules: [`descriptor`] (the VIA descriptor layout), [`workqueue`]
//! (work queues, doorbell, CQ rings), [`vi`] (per-VI state), [`engine`]
//! (the protocol engine), [`nic`], [`vi_api`] and [`region`] (the Rust
//! API: owners wrapped around the id-level calls of [`raw`]).

pub mod clock;
pub mod descriptor;
// The protocol engine is private to via-user: programs use the Rust API
// (or the id-level calls, `raw`). Tests that drive an engine frame by
// frame (the tests crate's rig) reach it with the `test-support` feature.
#[cfg(feature = "test-support")]
pub mod engine;
#[cfg(not(feature = "test-support"))]
mod engine;
mod engine_lock;
pub mod error;
pub mod nic;
pub mod notify;
mod progress;
pub mod raw;
pub mod region;
mod reorder;
mod rtt;
mod shared;
mod usermem;
pub mod vi;
pub mod vi_api;
pub mod srq_api;
mod waker;
pub mod workqueue;

pub use engine::{ack_every_for, AsyncError, AsyncErrorKind, Config, Counters, IncomingRequest};
pub use clock::Time;
pub use error::{Result, ViaError, VipReturn};
pub use nic::{Completion, Nic, NicAttributes};
pub use notify::{Notice, NotifyTarget};
pub use raw::RawNic;
pub use region::{Descriptor, MemoryRegion, Op, RemoteBuffer};
pub use vi::{Reliability, ViAttributes, ViPhase};
pub use srq_api::Srq;
pub use vi_api::{Cq, Vi};
pub use via_kernel_agent::memory::{MemAttributes, Ptag};
pub use via_wire::MacAddr;

/// Opens a frame device by its VIA name, trying every driver linked into
/// the program (see `via_device::registry`): `tulip:<pci>` and
/// `/dev/via_tulip<N>` (via-nic-tulip: DEC 2114x over VFIO), `e1000e:<pci>`
/// and `/dev/via_e1000e<N>` (via-nic-e1000e: Intel 82574 over VFIO), `/dev/via_lo`
/// and `loop:<wire>` (in-process loopback), `/dev/via_<ifname>` (software
/// NIC over AF_PACKET), `shm:<wire>` (shared memory between processes of
/// this host) and `<nic>+shm:<wire>` (a composite: the wire for processes
/// attached to it, the NIC for the rest) from via-softnic.
///
/// A composite's routes come from the hosts file (`VIA_HOSTS`): a
/// composite of several NICs needs it readable; one NIC goes without
/// routes if it is not (the engine then has no names either).
pub fn open_device(name: &str) -> std::io::Result<Box<dyn via_device::FrameDevice>> {
    let mut routes = Vec::new();
    if name.contains('+') {
        let nics = name.split('?').next().unwrap_or(name).split('+').filter(|m| !m.starts_with("shm:")).count();
        match via_kernel_agent::names::NameService::load_default() {
            Ok(hosts) => routes = hosts.routes(),
            Err(e) if nics > 1 => return Err(std::io::Error::new(e.kind(), format!("joining {name:?}: {e}"))),
            Err(_) => {}
        }
    }
    via_device::open_device(name, &routes)
}
