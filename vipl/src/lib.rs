//! vipl: the VIA 1.0 C ABI. Builds `libvipl.so` and `libvipl.a`, which
//! export the 41 functions of `vipl.h` (the project's `include/vipl.h`),
//! over the via-user VI provider.
//!
//! Modules: [`types`] (the `#[repr(C)]` structures and constants, layouts
//! asserted), [`handles`] (the table behind every opaque handle), [`api`]
//! and [`manage`] (the functions), [`ext`] (the extensions of `vipl_ext.h`);
//! `drivers` (the device drivers linked in).

#![allow(non_snake_case)]

pub mod api;
mod drivers;
pub mod ext;
pub mod handles;
mod hazard;
pub mod manage;
pub mod types;
