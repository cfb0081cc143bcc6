//! The CG benchmark's arithmetic, written once over any way of computing
//! a matrix-vector product and a dot product: in one process
//! ([`crate::serial`]) or across a process grid ([`crate::dist`]).

use crate::npb::{Class, Csr, CGITMAX};

/// A and the dot product, for the part of each vector this process holds.
pub trait Operator {
    /// out = A v (this process's parts of both).
    fn matvec(&mut self, v: &[f64], out: &mut [f64]);
    /// The dot product of two whole vectors, from this process's parts.
    fn dot(&mut self, a: &[f64], b: &[f64]) -> f64;
    /// Just before the clock starts (so every process starts together).
    fn before_timing(&mut self) {}
    /// The run's time, from this process's measurement.
    fn run_time(&self, seconds: f64) -> f64 {
        seconds
    }
}

/// q = A p over the rows of `m`.
pub fn spmv(m: &Csr, p: &[f64], q: &mut [f64]) {
    for (j, qj) in q.iter_mut().enumerate() {
        let mut sum = 0.0;
        for k in m.rowstr[j]..m.rowstr[j + 1] {
            sum += m.a[k] * p[m.colidx[k]];
        }
        *qj = sum;
    }
}

/// The dot product of two local slices.
pub fn local_dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The result of a run.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub zeta: f64,
    pub rnorm: f64,
    pub seconds: f64,
}

/// `conj_grad`: 25 CG iterations on A z = x from z = 0; returns ||x - A z||.
pub fn conj_grad<O: Operator>(op: &mut O, x: &[f64], z: &mut [f64], p: &mut [f64], q: &mut [f64], r: &mut [f64]) -> f64 {
    let n = x.len();
    for j in 0..n {
        q[j] = 0.0;
        z[j] = 0.0;
        r[j] = x[j];
        p[j] = r[j];
    }
    let mut rho = op.dot(r, r);
    for _ in 0..CGITMAX {
        op.matvec(p, q);
        let d = op.dot(p, q);
        let alpha = rho / d;
        let rho0 = rho;
        for j in 0..n {
            z[j] += alpha * p[j];
            r[j] -= alpha * q[j];
        }
        rho = op.dot(r, r);
        let beta = rho / rho0;
        for j in 0..n {
            p[j] = r[j] + beta * p[j];
        }
    }
    op.matvec(z, r);
    let diff: Vec<f64> = x.iter().zip(r.iter()).map(|(a, b)| a - b).collect();
    op.dot(&diff, &diff).sqrt()
}

/// The benchmark on vectors of `n` local elements: one untimed
/// iteration, then `niter` timed ones of the inverse power method;
/// `report(it, rnorm, zeta)` sees each.
pub fn benchmark<O: Operator>(class: &Class, op: &mut O, n: usize, mut report: impl FnMut(usize, f64, f64)) -> Outcome {
    let mut x = vec![1.0; n];
    let (mut z, mut p, mut q, mut r) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut step = |op: &mut O, x: &mut [f64], z: &mut [f64]| -> (f64, f64) {
        let rnorm = conj_grad(op, x, z, &mut p, &mut q, &mut r);
        let t1 = op.dot(x, z);
        let t2 = 1.0 / op.dot(z, z).sqrt();
        for j in 0..n {
            x[j] = t2 * z[j];
        }
        (rnorm, t1)
    };
    step(op, &mut x, &mut z); // untimed warm-up, as NPB does
    x.iter_mut().for_each(|v| *v = 1.0);
    op.before_timing();
    let start = std::time::Instant::now();
    let mut out = Outcome { zeta: 0.0, rnorm: 0.0, seconds: 0.0 };
    for it in 1..=class.niter {
        let (rnorm, t1) = step(op, &mut x, &mut z);
        out.zeta = class.shift + 1.0 / t1;
        out.rnorm = rnorm;
        report(it, rnorm, out.zeta);
    }
    out.seconds = op.run_time(start.elapsed().as_secs_f64());
    out
}
