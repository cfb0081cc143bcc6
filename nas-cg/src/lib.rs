//! NPB CG: the matrix generator of the NAS Parallel Benchmarks (NPB's
//! linear congruential generator `randlc`, `makea`/`sprnvc`/`vecset`/
//! `sparse`), the conjugate-gradient inner solve and the outer inverse
//! power iteration whose `zeta` is checked against NPB's verification
//! values.
//!
//! [`npb`] generates the matrix, for all rows or for a range of them (a
//! process of a 2-D decomposition builds only its block); [`kernel`] is
//! the iteration, over any [`kernel::Operator`]; [`serial`] runs it in
//! one process (the reference), [`dist`] across an MTTL process grid.

pub mod kernel;
pub mod npb;
pub mod serial;
pub mod dist;
