//! CG over MTTL with NPB MPI's 2-D decomposition: P = 2^k processes in a
//! grid of `nprows` x `npcols` (square, or twice as many columns as rows);
//! process (pr, pc) = rank pr * npcols + pc holds the block of A in row
//! block pr and column block pc, and every vector in column block pc.
//!
//! A matrix-vector product: each process multiplies its block, the
//! process row sums the partial results (`Group::sum`), and each process
//! gets its column block of the product from its partner in the row that
//! holds those rows (`sendrecv`, the transpose exchange). Dot products are
//! summed over the process row (its members hold every column block).

use crate::npb::{makea, Class, Csr, CGITMAX};
use mttl_via::{my_pe, pe_num, sendrecv, Group};
use std::ops::Range;

/// This process's place in the grid.
#[derive(Clone, Debug)]
pub struct Grid {
    pub nprows: usize,
    pub npcols: usize,
    pub pr: usize,
    pub pc: usize,
    pub rows: Range<usize>,
    pub cols: Range<usize>,
    /// The process whose rows hold our column block; we hold its column
    /// block in turn.
    pub partner: usize,
}

impl Grid {
    /// NPB's grid for `p` processes (a power of two) and order `na`.
    pub fn new(rank: usize, p: usize, na: usize) -> Result<Grid, String> {
        if !p.is_power_of_two() {
            return Err(format!("CG runs on a power-of-two number of processes, not {p}"));
        }
        let k = p.trailing_zeros();
        let nprows = 1usize << (k / 2);
        let npcols = p / nprows;
        if na % npcols != 0 {
            return Err(format!("the matrix order {na} does not split into {npcols} column blocks"));
        }
        let (pr, pc) = (rank / npcols, rank % npcols);
        let (rb, cb) = (na / nprows, na / npcols);
        let f = npcols / nprows;
        let partner = (pc / f) * npcols + f * pr + pc % f;
        Ok(Grid { nprows, npcols, pr, pc, rows: pr * rb..(pr + 1) * rb, cols: pc * cb..(pc + 1) * cb, partner })
    }

    fn row_group(&self) -> Group {
        Group::new((0..self.npcols).map(|c| self.pr * self.npcols + c).collect())
    }
}

/// The local block: rows `grid.rows`, columns `grid.cols` (local indices).
fn block(class: &Class, g: &Grid) -> Csr {
    let m = makea(class, g.rows.clone());
    let mut out = Csr { rowstr: vec![0], colidx: Vec::new(), a: Vec::new() };
    for j in 0..g.rows.len() {
        for k in m.rowstr[j]..m.rowstr[j + 1] {
            if g.cols.contains(&m.colidx[k]) {
                out.colidx.push(m.colidx[k] - g.cols.start);
                out.a.push(m.a[k]);
            }
        }
        out.rowstr.push(out.a.len());
    }
    out
}

struct Solver {
    g: Grid,
    row: Group,
    m: Csr,
    /// The row block's partial and summed products.
    w: Vec<f64>,
}

impl Solver {
    /// out (column block) = (A v) restricted to our column block.
    fn matvec(&mut self, v: &[f64], out: &mut [f64]) {
        crate::serial::spmv(&self.m, v, &mut self.w);
        if self.g.nprows == 1 {
            // One process row: each process is its own partner and needs
            // just its column block of the sum, so a reduce-scatter (half
            // the traffic of a full sum) is enough.
            let mine = self.row.reduce_scatter_sum(&mut self.w);
            debug_assert_eq!(mine.len(), out.len());
            out.copy_from_slice(&self.w[mine]);
            return;
        }
        self.row.sum(&mut self.w);
        // Our partner's column block lies in our row block: send it that
        // part; receive ours from it.
        let their_cols = partner_cols(&self.g);
        let at = their_cols.start - self.g.rows.start;
        sendrecv(self.g.partner, &self.w[at..at + their_cols.len()], self.g.partner, out);
    }

    fn dot(&self, a: &[f64], b: &[f64]) -> f64 {
        let mut s = [a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>()];
        self.row.sum(&mut s);
        s[0]
    }
}

/// The column block of our partner (it lies inside our row block).
fn partner_cols(g: &Grid) -> Range<usize> {
    let cb = g.cols.len();
    let pc = g.partner % g.npcols;
    pc * cb..(pc + 1) * cb
}

/// What rank 0 reports.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub zeta: f64,
    pub rnorm: f64,
    pub seconds: f64,
}

/// The benchmark on every process of the run (call it on all of them, in
/// an SPMD phase). `report(it, rnorm, zeta)` sees each iteration.
pub fn run(class: &Class, mut report: impl FnMut(usize, f64, f64)) -> Result<Outcome, String> {
    let g = Grid::new(my_pe(), pe_num(), class.na)?;
    let row = g.row_group();
    let m = block(class, &g);
    let n = g.cols.len();
    let mut s = Solver { w: vec![0.0; g.rows.len()], g, row, m };
    let mut x = vec![1.0; n];
    let (mut z, mut p, mut q, mut r) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut step = |s: &mut Solver, x: &mut Vec<f64>, z: &mut Vec<f64>| -> (f64, f64) {
        for j in 0..n {
            q[j] = 0.0;
            z[j] = 0.0;
            r[j] = x[j];
            p[j] = r[j];
        }
        let mut rho = s.dot(&r, &r);
        for _ in 0..CGITMAX {
            s.matvec(&p, &mut q);
            let d = s.dot(&p, &q);
            let alpha = rho / d;
            let rho0 = rho;
            for j in 0..n {
                z[j] += alpha * p[j];
                r[j] -= alpha * q[j];
            }
            rho = s.dot(&r, &r);
            let beta = rho / rho0;
            for j in 0..n {
                p[j] = r[j] + beta * p[j];
            }
        }
        s.matvec(z, &mut r);
        let diff: Vec<f64> = x.iter().zip(r.iter()).map(|(a, b)| a - b).collect();
        let rnorm = s.dot(&diff, &diff).sqrt();
        let t1 = s.dot(x, z);
        let t2 = 1.0 / s.dot(z, z).sqrt();
        for j in 0..n {
            x[j] = t2 * z[j];
        }
        (rnorm, t1)
    };
    step(&mut s, &mut x, &mut z);
    x.iter_mut().for_each(|v| *v = 1.0);
    mttl_via::Barrier::wait();
    let start = std::time::Instant::now();
    let mut out = Outcome { zeta: 0.0, rnorm: 0.0, seconds: 0.0 };
    for it in 1..=class.niter {
        let (rnorm, t1) = step(&mut s, &mut x, &mut z);
        out.zeta = class.shift + 1.0 / t1;
        out.rnorm = rnorm;
        report(it, rnorm, out.zeta);
    }
    out.seconds = mttl_via::Reduction::max_of(start.elapsed().as_secs_f64());
    Ok(out)
}
