//! The privileged control plane that VIA 1.0 calls the *kernel agent*.
//!
//! It owns what every VI provider needs regardless of the NIC underneath:
//! - [`device`]: the narrow frame-device trait that NIC drivers implement,
//!   and the table of drivers that opens a device by its VIA name;
//! - [`wire`]: the on-the-wire header of VIA frames (typed views, parse/emit);
//! - [`memory`]: the memory registration table and protection tags;
//! - [`memlock`]: explaining a pin refused by `RLIMIT_MEMLOCK`;
//! - [`backoff`]: the retransmission schedule of control-plane requests;
//! - [`conn`]: the connection manager of the client/server model (sans-IO);
//! - [`peer`]: peer-to-peer connections (sans-IO);
//! - [`names`]: the name service (hosts file);
//! - [`crc32c`]: the frame checksum for devices without a hardware one;
//! - [`auth`]: the cluster secret, key derivation and the frame MAC that
//!   replaces the checksum when a secret is configured;
//! - [`resolver`]: name discovery on the segment (sans-IO);
//! - [`netns`]: running `ip` for tools that build hosts from namespaces.

pub mod auth;
pub mod backoff;
pub mod conn;
pub mod crc32c;
pub mod device;
pub mod mac;
pub mod memlock;
pub mod memory;
pub mod names;
pub mod netns;
pub mod pci;
pub mod peer;
pub mod resolver;
pub mod wire;

pub use device::{Capabilities, DeviceOpener, FrameDevice, LentPayload, RxFilter, TxFrame};
pub use mac::MacAddr;
