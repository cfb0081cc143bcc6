//! The CG benchmark's arithmetic, written once over any way of computing
//! a matrix-vector product and a dot product: in one process
//! ([`crate::serial`]) or across a process grid ([`crate::dist`]).
//!
//! The product reads the matrix with narrow column indices (4 bytes, as
//! NPB's Fortran, or 2 where the block allows: the product is bound by
//! the bytes it streams, 8 of value and the index's per entry), no bounds
//! checks in the inner loop
//! (every index is checked once, when the block is built), and the
//! vector updates of an iteration fused into one pass with the dot
//! product that follows them.

use crate::npb::{Class, Csr, CGITMAX};

/// A and the dot product, for the part of each vector this process holds.
pub trait Operator {
    /// out = A v (this process's parts of both).
    fn matvec(&mut self, v: &[f64], out: &mut [f64]);
    /// The sum over the processes that together hold a whole vector of
    /// each one's `local` part of a dot product.
    fn sum(&mut self, local: f64) -> f64;
    /// The dot product of two whole vectors, from this process's parts.
    fn dot(&mut self, a: &[f64], b: &[f64]) -> f64 {
        self.sum(local_dot(a, b))
    }
    /// Just before the clock starts (so every process starts together).
    fn before_timing(&mut self) {}
    /// The run's time, from this process's measurement.
    fn run_time(&self, seconds: f64) -> f64 {
        seconds
    }
}

/// A block of the matrix as the product reads it: compressed rows whose
/// column indices are each checked below `ncols` when built, and stored
/// in 2 bytes when the block has at most 65,536 columns (class A, and
/// class B's blocks from 2 processes on), else in 4 (NPB's width). The
/// product streams the whole block once per call, so the bytes per entry
/// (8 of value, 2 or 4 of index) set its speed.
#[derive(Clone, Debug)]
pub struct SparseBlock {
    rowstr: Vec<usize>,
    colidx: Columns,
    a: Vec<f64>,
    ncols: usize,
}

#[derive(Clone, Debug)]
enum Columns {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

impl SparseBlock {
    /// The rows of `m`, whose column indices must lie below `ncols`.
    pub fn new(m: &Csr, ncols: usize) -> Result<SparseBlock, String> {
        let n = m.a.len();
        if m.colidx.len() != n || m.rowstr.first() != Some(&0) || m.rowstr.last() != Some(&n) || m.rowstr.windows(2).any(|w| w[0] > w[1]) {
            return Err("the matrix's row starts do not index its entries in order".into());
        }
        if ncols > u32::MAX as usize {
            return Err(format!("{ncols} columns do not fit 4-byte indices"));
        }
        if let Some(k) = m.colidx.iter().position(|&c| c >= ncols) {
            return Err(format!("entry {k} is in column {}, past the block's {ncols} columns", m.colidx[k]));
        }
        let colidx = if ncols <= 1 << 16 { Columns::Narrow(streamed(m.colidx.iter().map(|&c| c as u16))) } else { Columns::Wide(streamed(m.colidx.iter().map(|&c| c as u32))) };
        Ok(SparseBlock { rowstr: m.rowstr.clone(), colidx, a: streamed(m.a.iter().copied()), ncols })
    }

    pub fn rows(&self) -> usize {
        self.rowstr.len() - 1
    }

    pub fn cols(&self) -> usize {
        self.ncols
    }

    /// Stored entries.
    pub fn nonzeros(&self) -> usize {
        self.a.len()
    }

    /// Bytes of each column index (2 or 4).
    pub fn index_bytes(&self) -> usize {
        match self.colidx {
            Columns::Narrow(_) => 2,
            Columns::Wide(_) => 4,
        }
    }
}

/// The items, in a vector whose memory the kernel is asked to back with
/// (transparent, 2 MiB) huge pages before it is first written. The product
/// streams a block's values and indices whole in every call; in 4 KiB
/// pages a class B block (tens of megabytes per process) costs a page walk
/// every 4 KiB of it: CG B at 2 processes went from 1.018 of NPB-MPI's
/// time to 0.934 with huge pages (`cg-bench --against-npb`, 20 rounds each,
/// 2026-11-29). Where the system turned transparent huge pages off, the
/// advice does nothing.
fn streamed<T>(items: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let mut v = Vec::with_capacity(items.len());
    advise_huge_pages(v.as_ptr() as usize, v.capacity() * std::mem::size_of::<T>());
    v.extend(items);
    v
}

/// Asks for huge pages over the whole 2 MiB pages inside `[addr, addr + len)`.
fn advise_huge_pages(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let (start, end) = (addr.next_multiple_of(HUGE), (addr + len) / HUGE * HUGE);
    if end > start {
        // SAFETY: advice on whole pages inside an allocation this process
        // owns: it changes how the kernel backs them, never what they hold.
        // Refused advice (no transparent huge pages here) is harmless.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// q = A p over the rows of `m`: `p` holds at least the block's columns,
/// `q` one value per row.
pub fn spmv(m: &SparseBlock, p: &[f64], q: &mut [f64]) {
    assert!(p.len() >= m.ncols && q.len() == m.rows(), "spmv: {} x {} block, vector of {}, result of {}", m.rows(), m.ncols, p.len(), q.len());
    match &m.colidx {
        Columns::Narrow(c) => spmv_rows(&m.rowstr, c, &m.a, p, q),
        Columns::Wide(c) => spmv_rows(&m.rowstr, c, &m.a, p, q),
    }
}

/// A stored column index: 2 or 4 bytes, read as a `usize`.
trait ColumnIndex: Copy {
    fn get(self) -> usize;
}

impl ColumnIndex for u16 {
    #[inline(always)]
    fn get(self) -> usize {
        self as usize
    }
}

impl ColumnIndex for u32 {
    #[inline(always)]
    fn get(self) -> usize {
        self as usize
    }
}

/// [`spmv`] for one index width. Every index in `colidx` is below
/// `p.len()` (the caller's promise, from `SparseBlock::new` and its
/// assertion).
#[inline(always)]
fn spmv_rows<I: ColumnIndex>(rowstr: &[usize], colidx: &[I], a: &[f64], p: &[f64], q: &mut [f64]) {
    // SAFETY (each `get_unchecked` below): every column index was checked
    // against the block's column count, which `p` covers (see above).
    let at = |c: I| unsafe { *p.get_unchecked(c.get()) };
    for (j, qj) in q.iter_mut().enumerate() {
        let (lo, hi) = (rowstr[j], rowstr[j + 1]);
        let (a, c) = (&a[lo..hi], &colidx[lo..hi]);
        // Four partial sums: one sum would be a chain of dependent
        // additions, each waiting for the last. The order of the
        // additions changes the result in its last bits only; zeta
        // verifies either way, as it does for NPB on any process count.
        let mut s = [0.0f64; 4];
        let (a4, a_rest) = a.split_at(a.len() / 4 * 4);
        let (c4, c_rest) = c.split_at(a4.len());
        for (x, k) in a4.chunks_exact(4).zip(c4.chunks_exact(4)) {
            s[0] += x[0] * at(k[0]);
            s[1] += x[1] * at(k[1]);
            s[2] += x[2] * at(k[2]);
            s[3] += x[3] * at(k[3]);
        }
        for (x, &k) in a_rest.iter().zip(c_rest) {
            s[0] += x * at(k);
        }
        *qj = (s[0] + s[1]) + (s[2] + s[3]);
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
        // z += alpha p, r -= alpha q, and r . r, in one pass.
        let mut rr = 0.0;
        for (((zj, rj), pj), qj) in z.iter_mut().zip(r.iter_mut()).zip(p.iter()).zip(q.iter()) {
            *zj += alpha * pj;
            *rj -= alpha * qj;
            rr += *rj * *rj;
        }
        rho = op.sum(rr);
        let beta = rho / rho0;
        for (pj, rj) in p.iter_mut().zip(r.iter()) {
            *pj = rj + beta * *pj;
        }
    }
    op.matvec(z, r);
    let local: f64 = x.iter().zip(r.iter()).map(|(a, b)| (a - b) * (a - b)).sum();
    op.sum(local).sqrt()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `rows` rows over `ncols` columns, row j holding up to
    /// 11 entries at columns spread over the whole width.
    fn block(rows: usize, ncols: usize) -> Csr {
        let mut m = Csr { rowstr: vec![0], colidx: Vec::new(), a: Vec::new() };
        for j in 0..rows {
            for k in 0..(j % 12) {
                m.colidx.push((j * 7919 + k * (ncols / 12 + 1)) % ncols);
                m.a.push(1.0 + (j * 31 + k) as f64 / 64.0);
            }
            m.rowstr.push(m.a.len());
        }
        m
    }

    fn naive(m: &Csr, p: &[f64]) -> Vec<f64> {
        (0..m.rowstr.len() - 1).map(|j| (m.rowstr[j]..m.rowstr[j + 1]).map(|k| m.a[k] * p[m.colidx[k]]).sum()).collect()
    }

    #[test]
    fn the_product_matches_a_plain_one_with_narrow_and_wide_indices() {
        for (ncols, width) in [(1000, 2), (1 << 16, 2), ((1 << 16) + 1, 4), (200_000, 4)] {
            let m = block(300, ncols);
            let b = SparseBlock::new(&m, ncols).unwrap();
            assert_eq!(b.index_bytes(), width, "{ncols} columns");
            // Values that are exact in binary: every order of addition
            // gives the same sum, so the four partial sums must match.
            let p: Vec<f64> = (0..ncols).map(|i| (i % 97) as f64 / 8.0).collect();
            let mut q = vec![f64::NAN; 300];
            spmv(&b, &p, &mut q);
            assert_eq!(q, naive(&m, &p), "{ncols} columns");
        }
    }

    /// A block's arrays, built in memory advised for huge pages, hold what
    /// they were built from: over several huge pages (with partial ones
    /// at both ends) and under one (no advice at all).
    #[test]
    fn streamed_vectors_hold_their_items() {
        for n in [0usize, 1, 1000, 3 << 20] {
            let v = streamed((0..n).map(|i| (i as u32).wrapping_mul(2654435761)));
            assert_eq!(v.len(), n);
            assert!(v.iter().enumerate().all(|(i, &x)| x == (i as u32).wrapping_mul(2654435761)));
        }
    }

    #[test]
    fn a_column_outside_the_block_or_rows_out_of_order_are_refused() {
        let mut m = block(50, 1000);
        assert!(SparseBlock::new(&m, 1000).is_ok());
        assert!(SparseBlock::new(&m, 900).unwrap_err().contains("past the block's 900 columns"));
        m.rowstr.swap(10, 20);
        assert!(SparseBlock::new(&m, 1000).unwrap_err().contains("row starts"));
    }

    #[test]
    #[should_panic(expected = "spmv")]
    fn a_vector_shorter_than_the_block_is_refused() {
        let b = SparseBlock::new(&block(10, 100), 100).unwrap();
        spmv(&b, &[0.0; 99], &mut [0.0; 10]);
    }
}
