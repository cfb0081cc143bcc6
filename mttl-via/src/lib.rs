//! MTTL (MPC++ Multi-Thread Template Library) over VIA.
//!
//! Not implemented yet: the crate holds its place in the workspace; the
//! runtime comes with the MTTL issue.
