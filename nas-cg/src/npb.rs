//! NPB's problem classes, random number generator and sparse matrix.
//!
//! Everything here follows the NPB 3 CG benchmark step by step, so that
//! the same seed gives the same matrix and `zeta` verifies against the
//! official values (NPB's `cg.c`/`cg.f`).

/// One NPB problem class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Class {
    pub name: char,
    /// Order of the matrix.
    pub na: usize,
    /// Nonzeros per generated sparse vector.
    pub nonzer: usize,
    /// Outer iterations.
    pub niter: usize,
    /// Shift of the eigenvalue problem.
    pub shift: f64,
    /// The official result.
    pub zeta_verify: f64,
}

pub const RCOND: f64 = 0.1;
/// Inner conjugate-gradient iterations per outer one.
pub const CGITMAX: usize = 25;

pub const CLASSES: [Class; 5] = [
    Class { name: 'S', na: 1400, nonzer: 7, niter: 15, shift: 10.0, zeta_verify: 8.5971775078648 },
    Class { name: 'W', na: 7000, nonzer: 8, niter: 15, shift: 12.0, zeta_verify: 10.362595087124 },
    Class { name: 'A', na: 14000, nonzer: 11, niter: 15, shift: 20.0, zeta_verify: 17.130235054029 },
    Class { name: 'B', na: 75000, nonzer: 13, niter: 75, shift: 60.0, zeta_verify: 22.712745482631 },
    Class { name: 'C', na: 150000, nonzer: 15, niter: 75, shift: 110.0, zeta_verify: 28.973605592845 },
];

impl Class {
    pub fn by_name(name: &str) -> Option<Class> {
        let c = name.trim().chars().next()?.to_ascii_uppercase();
        CLASSES.iter().copied().find(|k| k.name == c)
    }

    /// Verified when |zeta - reference| / reference <= 1e-10.
    pub fn verify(&self, zeta: f64) -> bool {
        ((zeta - self.zeta_verify) / self.zeta_verify).abs() <= 1.0e-10
    }

    /// NPB's operation count for Mop/s.
    pub fn mops(&self, seconds: f64) -> f64 {
        let nz = (self.nonzer * (self.nonzer + 1)) as f64;
        2.0 * self.niter as f64 * self.na as f64 * (3.0 + nz + 25.0 * (5.0 + nz) + 3.0) / seconds / 1.0e6
    }
}

/// NPB's generator: x <- a * x mod 2^46, returned as x / 2^46, computed
/// in doubles exactly as NPB does (so every platform gives the same bits).
pub fn randlc(x: &mut f64, a: f64) -> f64 {
    const R23: f64 = 1.0 / 8388608.0;
    const R46: f64 = R23 * R23;
    const T23: f64 = 8388608.0;
    const T46: f64 = T23 * T23;
    let t1 = R23 * a;
    let a1 = t1.trunc();
    let a2 = a - T23 * a1;
    let t1 = R23 * *x;
    let x1 = t1.trunc();
    let x2 = *x - T23 * x1;
    let t1 = a1 * x2 + a2 * x1;
    let t2 = (R23 * t1).trunc();
    let z = t1 - T23 * t2;
    let t3 = T23 * z + a2 * x2;
    let t4 = (R46 * t3).trunc();
    *x = t3 - T46 * t4;
    R46 * *x
}

/// The generator's state, seeded as NPB CG seeds it.
pub struct Rng {
    tran: f64,
}

pub const AMULT: f64 = 1220703125.0;

impl Rng {
    /// `tran = 314159265`, then one draw (NPB's `zeta = randlc(&tran, amult)`).
    pub fn npb_cg() -> Rng {
        let mut r = Rng { tran: 314159265.0 };
        r.next();
        r
    }

    /// The next number of NPB's generator (`randlc`), as NPB names it.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> f64 {
        randlc(&mut self.tran, AMULT)
    }
}

/// A sparse matrix in compressed rows: row `j` (local) holds
/// `colidx[rowstr[j]..rowstr[j+1]]` with values `a[..]`.
#[derive(Clone, Debug, Default)]
pub struct Csr {
    pub rowstr: Vec<usize>,
    pub colidx: Vec<usize>,
    pub a: Vec<f64>,
}

/// `sprnvc`: a sparse vector of `nz` distinct positions in 1..=n with
/// random values.
fn sprnvc(rng: &mut Rng, n: usize, nz: usize, nn1: usize, v: &mut Vec<f64>, iv: &mut Vec<usize>) {
    v.clear();
    iv.clear();
    while v.len() < nz {
        let vecelt = rng.next();
        let vecloc = rng.next();
        let i = (nn1 as f64 * vecloc) as usize + 1;
        if i > n || iv.contains(&i) {
            continue;
        }
        v.push(vecelt);
        iv.push(i);
    }
}

/// `vecset`: sets position `i` of the sparse vector to `val`, adding it
/// if absent.
fn vecset(v: &mut Vec<f64>, iv: &mut Vec<usize>, i: usize, val: f64) {
    let mut set = false;
    for k in 0..iv.len() {
        if iv[k] == i {
            v[k] = val;
            set = true;
        }
    }
    if !set {
        v.push(val);
        iv.push(i);
    }
}

/// `makea` + `sparse`: the class's matrix, rows `rows` (0-based, end
/// exclusive) only. Every process draws the whole random sequence, so any
/// row range gives exactly those rows of the whole matrix. Column indices
/// are global.
pub fn makea(class: &Class, rows: std::ops::Range<usize>) -> Csr {
    let n = class.na;
    let mut rng = Rng::npb_cg();
    let mut nn1 = 1;
    while nn1 < n {
        nn1 *= 2;
    }
    // The outer products' generating vectors: row i of `acol`/`aelt`.
    let mut arow = Vec::with_capacity(n);
    let mut acol: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut aelt: Vec<Vec<f64>> = Vec::with_capacity(n);
    let (mut v, mut iv) = (Vec::new(), Vec::new());
    for iouter in 0..n {
        sprnvc(&mut rng, n, class.nonzer, nn1, &mut v, &mut iv);
        vecset(&mut v, &mut iv, iouter + 1, 0.5);
        arow.push(v.len());
        acol.push(iv.iter().map(|&c| c - 1).collect());
        aelt.push(v.clone());
    }
    sparse(n, &arow, &acol, &aelt, rows, RCOND, class.shift)
}

/// `sparse`: sums the outer products into compressed rows (rows in
/// `rows` only), keeping columns sorted and merging duplicates in NPB's
/// order, with `rcond - shift` added on the diagonal.
fn sparse(n: usize, arow: &[usize], acol: &[Vec<usize>], aelt: &[Vec<f64>], rows: std::ops::Range<usize>, rcond: f64, shift: f64) -> Csr {
    let (first, nrows) = (rows.start, rows.len());
    let inside = |j: usize| j >= rows.start && j < rows.end;
    // Count the triples of each row.
    let mut rowstr = vec![0usize; nrows + 1];
    for i in 0..n {
        for &j in &acol[i][..arow[i]] {
            if inside(j) {
                rowstr[j - first + 1] += arow[i];
            }
        }
    }
    for j in 1..=nrows {
        rowstr[j] += rowstr[j - 1];
    }
    let nz = rowstr[nrows];
    const EMPTY: usize = usize::MAX;
    let mut a = vec![0.0f64; nz];
    let mut colidx = vec![EMPTY; nz];
    let mut nzloc = vec![0usize; nrows];
    let mut size = 1.0f64;
    let ratio = rcond.powf(1.0 / n as f64);
    for i in 0..n {
        for nza in 0..arow[i] {
            let j = acol[i][nza];
            if !inside(j) {
                continue;
            }
            let jl = j - first;
            let scale = size * aelt[i][nza];
            for nzrow in 0..arow[i] {
                let jcol = acol[i][nzrow];
                let mut va = aelt[i][nzrow] * scale;
                if jcol == j && j == i {
                    va = va + rcond - shift;
                }
                // Find the place of `jcol` in row `jl`, keeping it sorted.
                let (lo, hi) = (rowstr[jl], rowstr[jl + 1]);
                let mut k = lo;
                loop {
                    assert!(k < hi, "sparse: row {j} overflowed (internal error)");
                    if colidx[k] == EMPTY {
                        colidx[k] = jcol;
                        break;
                    }
                    if colidx[k] > jcol {
                        // Shift the filled tail right by one and insert.
                        for kk in (k..hi - 1).rev() {
                            if colidx[kk] != EMPTY {
                                a[kk + 1] = a[kk];
                                colidx[kk + 1] = colidx[kk];
                            }
                        }
                        colidx[k] = jcol;
                        a[k] = 0.0;
                        break;
                    }
                    if colidx[k] == jcol {
                        nzloc[jl] += 1; // a duplicate: summed in place
                        break;
                    }
                    k += 1;
                }
                a[k] += va;
            }
        }
        size *= ratio;
    }
    // Squeeze out the room left by duplicates.
    for j in 1..nrows {
        nzloc[j] += nzloc[j - 1];
    }
    let mut out_a = Vec::with_capacity(nz);
    let mut out_c = Vec::with_capacity(nz);
    let mut out_r = vec![0usize; nrows + 1];
    for j in 0..nrows {
        let j1 = if j > 0 { rowstr[j] - nzloc[j - 1] } else { 0 };
        let j2 = rowstr[j + 1] - nzloc[j];
        let start = rowstr[j];
        for k in 0..(j2 - j1) {
            out_a.push(a[start + k]);
            out_c.push(colidx[start + k]);
        }
        out_r[j + 1] = out_a.len();
    }
    Csr { rowstr: out_r, colidx: out_c, a: out_a }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn randlc_matches_npb() {
        // NPB's documented property: x_{k+1} = a * x_k mod 2^46.
        let mut x = 314159265.0;
        let r = randlc(&mut x, AMULT);
        let want = (314159265u128 * 1220703125u128) % (1u128 << 46);
        assert_eq!(x, want as f64);
        assert_eq!(r, want as f64 / (1u64 << 46) as f64);
    }

    #[test]
    fn a_row_range_is_those_rows_of_the_whole_matrix() {
        let c = Class::by_name("S").unwrap();
        let all = makea(&c, 0..c.na);
        let part = makea(&c, 500..700);
        let (lo, hi) = (all.rowstr[500], all.rowstr[700]);
        assert_eq!(part.colidx, all.colidx[lo..hi]);
        assert_eq!(part.a, all.a[lo..hi]);
        // Rows are sorted and free of duplicates.
        for j in 0..c.na {
            let r = &all.colidx[all.rowstr[j]..all.rowstr[j + 1]];
            assert!(r.windows(2).all(|w| w[0] < w[1]), "row {j}");
        }
    }
}
