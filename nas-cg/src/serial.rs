//! NPB CG in one process: the reference for the distributed version.

use crate::npb::{makea, Class, Csr, CGITMAX};

/// q = A p over the rows of `m` (column indices global, `p` whole).
pub fn spmv(m: &Csr, p: &[f64], q: &mut [f64]) {
    for (j, qj) in q.iter_mut().enumerate() {
        let mut sum = 0.0;
        for k in m.rowstr[j]..m.rowstr[j + 1] {
            sum += m.a[k] * p[m.colidx[k]];
        }
        *qj = sum;
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `conj_grad`: 25 CG iterations on A z = x from z = 0; returns ||x - A z||.
pub fn conj_grad(m: &Csr, x: &[f64], z: &mut [f64], p: &mut [f64], q: &mut [f64], r: &mut [f64]) -> f64 {
    let n = x.len();
    for j in 0..n {
        q[j] = 0.0;
        z[j] = 0.0;
        r[j] = x[j];
        p[j] = r[j];
    }
    let mut rho = dot(r, r);
    for _ in 0..CGITMAX {
        spmv(m, p, q);
        let d = dot(p, q);
        let alpha = rho / d;
        let rho0 = rho;
        for j in 0..n {
            z[j] += alpha * p[j];
            r[j] -= alpha * q[j];
        }
        rho = dot(r, r);
        let beta = rho / rho0;
        for j in 0..n {
            p[j] = r[j] + beta * p[j];
        }
    }
    spmv(m, z, r);
    x.iter().zip(r.iter()).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt()
}

/// The result of a run.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub zeta: f64,
    pub rnorm: f64,
    pub seconds: f64,
}

/// The benchmark: one untimed iteration, then `niter` timed ones of the
/// inverse power method; `report(it, rnorm, zeta)` sees each.
pub fn run(class: &Class, mut report: impl FnMut(usize, f64, f64)) -> Outcome {
    let n = class.na;
    let m = makea(class, 0..n);
    let mut x = vec![1.0; n];
    let (mut z, mut p, mut q, mut r) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut step = |x: &mut Vec<f64>, z: &mut Vec<f64>| -> (f64, f64) {
        let rnorm = conj_grad(&m, x, z, &mut p, &mut q, &mut r);
        let t1 = dot(x, z);
        let t2 = 1.0 / dot(z, z).sqrt();
        for j in 0..n {
            x[j] = t2 * z[j];
        }
        (rnorm, t1)
    };
    step(&mut x, &mut z); // untimed warm-up, as NPB does
    x.iter_mut().for_each(|v| *v = 1.0);
    let start = std::time::Instant::now();
    let mut out = Outcome { zeta: 0.0, rnorm: 0.0, seconds: 0.0 };
    for it in 1..=class.niter {
        let (rnorm, t1) = step(&mut x, &mut z);
        out.zeta = class.shift + 1.0 / t1;
        out.rnorm = rnorm;
        report(it, rnorm, out.zeta);
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
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
