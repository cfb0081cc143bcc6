//! The third-host rig (issue 22): three test hosts on one Ethernet
//! segment, A and B running VIA and connected, M an attacker that sees
//! their frames and forges its own ([`attacker`]).
//!
//! - [`segment`]: the hosts (network namespaces) and the hub joining them;
//! - [`hosts`]: A and B, opened in this process, their connection, and
//!   the cluster secret they may share ([`SecretFile`]);
//! - [`attacker`]: M's raw socket, what it learns and what it forges.

pub mod attacker;
pub mod hosts;
pub mod segment;

pub use attacker::{next_in_stream, stranger_key, Attacker};
pub use hosts::{Connected, Host, HostOptions, SecretFile, MEM, SERVICE, STEP};
pub use segment::{Segment, Station};
