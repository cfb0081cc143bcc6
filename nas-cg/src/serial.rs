//! NPB CG in one process: the reference for the distributed version.

use crate::kernel::{benchmark, spmv, Operator, Outcome, SparseBlock};
use crate::npb::{makea, Class};

/// The whole matrix in this process.
struct Whole(SparseBlock);

impl Operator for Whole {
    fn matvec(&mut self, v: &[f64], out: &mut [f64]) {
        spmv(&self.0, v, out);
    }
    fn sum(&mut self, local: f64) -> f64 {
        local
    }
}

/// The benchmark in one process; `report(it, rnorm, zeta)` sees each
/// iteration.
pub fn run(class: &Class, report: impl FnMut(usize, f64, f64)) -> Outcome {
    let m = SparseBlock::new(&makea(class, 0..class.na), class.na).expect("makea builds a valid matrix");
    benchmark(class, &mut Whole(m), class.na, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_s_verifies() {
        let c = Class::by_name("S").unwrap();
        let o = run(&c, |_, _, _| {});
        assert!(c.verify(o.zeta), "zeta {} against {}", o.zeta, c.zeta_verify);
    }

    #[test]
    fn class_w_verifies() {
        let c = Class::by_name("W").unwrap();
        let o = run(&c, |_, _, _| {});
        assert!(c.verify(o.zeta), "zeta {} against {}", o.zeta, c.zeta_verify);
    }
}

#[cfg(test)]
mod class_a {
    use super::*;

    /// Seconds in release; run with `cargo test --release -p nas-cg -- --ignored`.
    #[test]
    #[ignore]
    fn class_a_verifies() {
        let c = Class::by_name("A").unwrap();
        let o = run(&c, |_, _, _| {});
        assert!(c.verify(o.zeta), "zeta {} against {}", o.zeta, c.zeta_verify);
        eprintln!("class A serial: {:.2} s, {:.1} Mop/s", o.seconds, c.mops(o.seconds));
    }
}
