//! DEC 2114x ("tulip") driver over VFIO.
//!
//! Not implemented yet: this crate is a placeholder in the workspace so the
//! layering is fixed from the start. The driver comes with the tulip/VFIO
//! issue; until then no device name resolves to it.
