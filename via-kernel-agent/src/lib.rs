//! The privileged control plane that VIA 1.0 calls the *kernel agent*:
//! registration, connections, naming and PCI binding, above the wire
//! format (`via-wire`) and the frame devices (`via-device`).
//!
//! - [`memory`]: the memory registration table and protection tags;
//! - [`auth`]: the cluster secret and the frame keys derived from it;
//! - [`backoff`]: the retransmission schedule of control-plane requests;
//! - [`conn`]: the connection manager of the client/server model (sans-IO);
//! - [`peer`]: peer-to-peer connections (sans-IO);
//! - [`names`]: the name service (hosts file);
//! - [`resolver`]: name discovery on the segment (sans-IO);
//! - [`binding`]: handing a NIC to vfio-pci and back (`via-agent`);
//! - [`netns`]: running `ip` for tools that build hosts from namespaces;
//! - [`udp_port`]: the nftables rule that keeps the kernel's IP stack off
//!   VIA's UDP port (`via-agent udp-port`).

pub mod auth;
pub mod backoff;
pub mod binding;
pub mod conn;
pub mod memory;
pub mod names;
pub mod netns;
pub mod peer;
pub mod resolver;
pub mod udp_port;
