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

use crate::kernel::{benchmark, spmv, Operator, Outcome, SparseBlock};
use crate::npb::{makea, Class, Csr};
use mttl_via::{my_pe, pe_num, sendrecv, Group};
use std::ops::Range;
use std::time::{Duration, Instant};

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
    /// The partner's column block (inside our row block).
    pub partner_cols: Range<usize>,
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
        if !na.is_multiple_of(npcols) {
            return Err(format!("the matrix order {na} does not split into {npcols} column blocks"));
        }
        let (pr, pc) = (rank / npcols, rank % npcols);
        let (rb, cb) = (na / nprows, na / npcols);
        let f = npcols / nprows;
        let partner = (pc / f) * npcols + f * pr + pc % f;
        let ppc = partner % npcols;
        Ok(Grid { nprows, npcols, pr, pc, rows: pr * rb..(pr + 1) * rb, cols: pc * cb..(pc + 1) * cb, partner, partner_cols: ppc * cb..(ppc + 1) * cb })
    }

    fn row_group(&self) -> Group {
        Group::new((0..self.npcols).map(|c| self.pr * self.npcols + c).collect())
    }
}

/// The local block: rows `grid.rows`, columns `grid.cols` (local indices).
fn block(class: &Class, g: &Grid) -> SparseBlock {
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
    SparseBlock::new(&out, g.cols.len()).expect("the block's columns are its own")
}

struct Solver {
    g: Grid,
    row: Group,
    m: SparseBlock,
    /// The row block's partial and summed products.
    w: Vec<f64>,
    timers: Timers,
}

/// Where the time goes (`CG_TIMERS=1` prints it per process, as NPB's
/// `timeron` does): local products, the product's exchange, dot sums.
#[derive(Default, Debug)]
struct Timers {
    spmv: Duration,
    exchange: Duration,
    dots: Duration,
}

impl Operator for Solver {
    /// out (column block) = (A v) restricted to our column block.
    fn matvec(&mut self, v: &[f64], out: &mut [f64]) {
        let t0 = Instant::now();
        spmv(&self.m, v, &mut self.w);
        let t1 = Instant::now();
        self.timers.spmv += t1 - t0;
        self.exchange(out);
        self.timers.exchange += t1.elapsed();
    }

    fn sum(&mut self, local: f64) -> f64 {
        let mut s = [local];
        let t0 = Instant::now();
        self.row.sum(&mut s);
        self.timers.dots += t0.elapsed();
        s[0]
    }

    fn before_timing(&mut self) {
        mttl_via::Barrier::wait();
        self.timers = Timers::default();
    }

    /// The slowest process's time.
    fn run_time(&self, seconds: f64) -> f64 {
        mttl_via::Reduction::max_of(seconds)
    }
}

impl Solver {
    /// `out` = our column block of the row's summed product `w`.
    fn exchange(&mut self, out: &mut [f64]) {
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
        let at = self.g.partner_cols.start - self.g.rows.start;
        sendrecv(self.g.partner, &self.w[at..at + self.g.partner_cols.len()], self.g.partner, out);
    }
}

/// The benchmark on every process of the run (call it on all of them, in
/// an SPMD phase). `report(it, rnorm, zeta)` sees each iteration.
pub fn run(class: &Class, report: impl FnMut(usize, f64, f64)) -> Result<Outcome, String> {
    let g = Grid::new(my_pe(), pe_num(), class.na)?;
    let row = g.row_group();
    let m = block(class, &g);
    let n = g.cols.len();
    let mut s = Solver { w: vec![0.0; g.rows.len()], g, row, m, timers: Timers::default() };
    let out = benchmark(class, &mut s, n, report);
    if std::env::var_os("CG_TIMERS").is_some_and(|v| v != "0") {
        let t = &s.timers;
        eprintln!("cg timers, rank {}: local products {:.3} s, product exchange {:.3} s, dot sums {:.3} s", my_pe(), t.spmv.as_secs_f64(), t.exchange.as_secs_f64(), t.dots.as_secs_f64());
    }
    Ok(out)
}
