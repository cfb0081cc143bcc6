//! MTTL (MPC++'s Multi-Thread Template Library) over VIA.
//!
//! A program is one binary started on every process (by `mttl-run`,
//! Slurm's `srun` or `mpirun`). [`run`] connects the processes; process 0
//! runs the program's main function in a user-level thread, and every
//! process serves what the others ask of it:
//!
//! - [`invoke`] / [`ainvoke`]: run a [`remote!`] function on any process,
//!   waiting for the result or later ([`Pending`]);
//! - [`Sync`]: a synchronising queue (write, read, peek, queue_length),
//!   reachable from other processes through its [`GlobalSync`];
//! - [`GlobalPtr`]: a pointer into any process's global heap (read, write,
//!   indexing, bulk `nread`/`nwrite`, RDMA over VIA for large ranges);
//! - [`Barrier`], [`Reduction`], [`broadcast`]: collectives in SPMD phases
//!   started with [`on_all`];
//! - [`yield_now`], [`my_pe`], [`pe_num`].
//!
//! Layers, bottom up: [`comm`] (the eight primitives over VIA or TCP),
//! [`thread`] (user-level threads), `runtime` (the core every feature
//! reaches: state, message kinds, waiting for replies), the features
//! (user-facing modules), and `scheduler` (the loop, the dispatch of
//! message kinds to the features, [`run`]).

mod atomic;
pub mod beneath;
pub mod boot;
pub mod collective;
pub mod comm;
pub mod error;
pub mod global;
mod heap;
pub mod invoke;
pub mod registry;
mod runtime;
mod scheduler;
mod step;
pub mod sync;
pub mod thread;
pub mod wire;

// The device drivers, linked so that each registers itself in via-device's
// opener table (nothing here names them otherwise).
use via_nic_e1000e as _;
use via_nic_tulip as _;
use via_softnic as _;

pub use collective::{broadcast, sendrecv, Barrier, Group, Reduction};
pub use global::GlobalPtr;
pub use invoke::{ainvoke, ainvoke_detached, invoke, on_all, Pending};
pub use registry::RemoteFunction;
pub use runtime::{connections, device_counters, my_pe, pe_num};
pub use scheduler::run;
pub use sync::{GlobalSync, Sync};
pub use thread::yield_now;
pub use wire::{Pod, Wire};

#[doc(hidden)]
pub use linkme;
