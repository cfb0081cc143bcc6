//! The VIA wire format, on its own: what a VIA frame is, byte for byte.
//!
//! - [`frame`] (re-exported at the root): the header layout, frame kinds and
//!   flags, typed views over byte slices with checked constructors and
//!   `Repr` structs for parse/emit (smoltcp's `wire` style), sealing a
//!   frame with its checksum or its tag;
//! - [`crc32c`]: the frame checksum for devices that cannot vouch for what
//!   they deliver;
//! - [`tag`]: the keyed MAC an authenticated frame carries instead;
//! - [`mac`]: Ethernet MAC addresses;
//! - [`continuation`]: what the fragments of one message repeat of the
//!   first's headers (the receiver's header prediction).
//!
//! Drivers, the kernel agent and the engine all read and write frames
//! through this crate; it depends on nothing of theirs.

pub mod continuation;
pub mod crc32c;
pub mod frame;
pub mod mac;
pub mod tag;

pub use continuation::{next_fragment, ContinuationKey};
pub use frame::*;
pub use mac::MacAddr;
