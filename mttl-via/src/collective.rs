//! Collectives among all processes: [`Barrier`], [`Reduction`] (allreduce:
//! recursive doubling for short vectors, Rabenseifner's reduce-scatter +
//! allgather for long ones) and [`broadcast`] (a binomial tree for short
//! data, van de Geijn's scatter + ring allgather for long).
//!
//! Every process must call the same collectives in the same order (a
//! process outside a [`Group`] calls [`skip`] in place of the group's
//! collective), one thread per process at a time (the SPMD phases that [`crate::on_all`]
//! starts). Steps travel as COLL messages tagged with the collective's
//! sequence number and the step, so they never mix. Non-power-of-two
//! process counts fold the extra ranks into the lower ones first.

use crate::runtime::{my_pe, pe_num, with};
use crate::step::{recv as recv_step, send as send_step};
use crate::wire::{pod_bytes, pod_bytes_mut, Pod};

/// Data of at least this many bytes takes the long algorithms
/// (`MTTL_COLL_LONG`, default 8 KiB; read once, not at every collective).
fn long_bytes() -> usize {
    static LONG: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LONG.get_or_init(|| std::env::var("MTTL_COLL_LONG").ok().and_then(|v| v.parse().ok()).unwrap_or(8192))
}

/// Counts a collective this process takes no part in (a group it is not
/// a member of), so that its sequence stays in step with the members'.
/// Every process calls every collective, or `skip` in its place.
pub fn skip() {
    next_seq();
}

fn next_seq() -> u64 {
    with(|rt| {
        rt.coll_seq += 1;
        rt.coll_seq
    })
}

fn tag(seq: u64, step: u64) -> u64 {
    seq << 16 | step
}

fn check_len(node: usize, got: usize, want: usize) {
    if got != want {
        panic!("collective step from rank {node}: {got} bytes where {want} were expected (do all processes pass the same length?)");
    }
}

/// Checks that `node` sent `n` elements and lends them to `f` (in place
/// when aligned, as COLL payloads are; else copied).
fn elems<T: Pod, R>(node: usize, bytes: &[u8], n: usize, f: impl FnOnce(&[T]) -> R) -> R {
    check_len(node, bytes.len(), n * std::mem::size_of::<T>());
    if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        // SAFETY: T is Pod (any bytes are a valid T), the pointer is
        // aligned and the length checked.
        return f(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), n) });
    }
    // SAFETY: zero is a valid Pod value.
    let mut v = vec![unsafe { std::mem::zeroed::<T>() }; n];
    pod_bytes_mut(&mut v).copy_from_slice(bytes);
    f(&v)
}

/// Waits for `n` elements of T from `node` and lends them to `f`.
fn recv_with<T: Pod, R>(node: usize, t: u64, n: usize, f: impl FnOnce(&[T]) -> R) -> R {
    recv_step(node, t, |b| elems(node, b, n, f))
}

fn recv_into<T: Pod>(node: usize, t: u64, out: &mut [T]) {
    let out = pod_bytes_mut(out);
    recv_step(node, t, |b| {
        check_len(node, b.len(), out.len());
        out.copy_from_slice(b)
    })
}

/// Waiting until every process arrived.
pub struct Barrier;

impl Barrier {
    /// The dissemination barrier: ceil(log2 n) rounds of one message each.
    pub fn wait() {
        let seq = next_seq();
        let (me, n) = (my_pe(), pe_num());
        if n == 1 {
            return;
        }
        let (mut k, mut step) = (1, 0);
        while k < n {
            send_step((me + k) % n, tag(seq, step), &[]);
            recv_step((me + n - k) % n, tag(seq, step), |_| ());
            k <<= 1;
            step += 1;
        }
    }
}

/// Combining a vector across all processes; every process gets the result.
/// Operations must be associative and commutative.
pub struct Reduction;

impl Reduction {
    pub fn sum<T: Pod + std::ops::AddAssign>(v: &mut [T]) {
        Self::with(v, |a, b| *a += *b)
    }
    pub fn min<T: Pod + PartialOrd>(v: &mut [T]) {
        Self::with(v, |a, b| {
            if *b < *a {
                *a = *b
            }
        })
    }
    pub fn max<T: Pod + PartialOrd>(v: &mut [T]) {
        Self::with(v, |a, b| {
            if *b > *a {
                *a = *b
            }
        })
    }
    /// The sum of `x` over all processes.
    pub fn sum_of<T: Pod + std::ops::AddAssign>(x: T) -> T {
        let mut v = [x];
        Self::sum(&mut v);
        v[0]
    }
    pub fn min_of<T: Pod + PartialOrd>(x: T) -> T {
        let mut v = [x];
        Self::min(&mut v);
        v[0]
    }
    pub fn max_of<T: Pod + PartialOrd>(x: T) -> T {
        let mut v = [x];
        Self::max(&mut v);
        v[0]
    }

    /// Allreduce of `v` with the element operation `op(acc, other)`.
    pub fn with<T: Pod>(v: &mut [T], op: impl Fn(&mut T, &T)) {
        Group::world().allreduce_with(v, op)
    }
}

/// Some of the processes, in a fixed order, running collectives among
/// themselves (an MPI communicator): the rows of a process grid, say.
/// Every member calls the group's collectives in the same order, and in
/// the same order relative to every other collective it calls.
#[derive(Clone, Debug)]
pub struct Group {
    members: Vec<usize>,
    me: usize,
}

impl Group {
    /// Every process, in rank order.
    pub fn world() -> Group {
        Group { members: (0..pe_num()).collect(), me: my_pe() }
    }

    /// The group of `members` (distinct ranks, this process among them).
    pub fn new(members: Vec<usize>) -> Group {
        let me = members.iter().position(|&r| r == my_pe()).unwrap_or_else(|| panic!("rank {} is not in the group {members:?}", my_pe()));
        Group { members, me }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// This process's place in the group.
    pub fn index(&self) -> usize {
        self.me
    }

    /// Sum of `v` over the group, in place on every member.
    pub fn sum<T: Pod + std::ops::AddAssign>(&self, v: &mut [T]) {
        self.allreduce_with(v, |a, b| *a += *b)
    }

    /// Reduce-scatter by recursive halving: afterwards this member's
    /// block, which the result names, holds the group's sum there (the
    /// rest of `v` is scratch). The group size must be a power of two
    /// dividing `v.len()`; member k gets the k-th of equal blocks.
    pub fn reduce_scatter_sum<T: Pod + std::ops::AddAssign>(&self, v: &mut [T]) -> std::ops::Range<usize> {
        let (me, n, rank) = (self.me, self.members.len(), &self.members);
        assert!(n.is_power_of_two() && v.len().is_multiple_of(n), "reduce_scatter over {n} members of {} elements", v.len());
        let seq = next_seq();
        if n == 1 {
            return 0..v.len();
        }
        let (mine, _) = halve(v, me, rank, n, seq, 0, &|acc: &mut [T], other: &[T]| acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b));
        mine
    }

    /// Allreduce of `v` over the group with `op(acc, other)`.
    pub fn allreduce_with<T: Pod>(&self, v: &mut [T], op: impl Fn(&mut T, &T)) {
        // Every collective takes one sequence number, even when it has
        // nothing to do, so that all processes stay in step.
        let seq = next_seq();
        let (me, n, rank) = (self.me, self.members.len(), &self.members);
        if n == 1 || v.is_empty() {
            return;
        }
        let combine = |acc: &mut [T], other: &[T]| acc.iter_mut().zip(other).for_each(|(a, b)| op(a, b));
        let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let extra = n - p2;
        // Fold: members p2.. hand their vectors to member - p2 and wait for the answer.
        if me >= p2 {
            send_step(rank[me - p2], tag(seq, 0), pod_bytes(v));
            recv_into(rank[me - p2], tag(seq, 1), v);
            return;
        }
        if me < extra {
            let n = v.len();
            recv_with(rank[me + p2], tag(seq, 0), n, |o: &[T]| combine(v, o));
        }
        let long = std::mem::size_of_val(v) >= long_bytes() && v.len() >= p2;
        if p2 > 1 {
            if long {
                rabenseifner(v, me, rank, p2, seq, &combine);
            } else {
                let (mut mask, mut step) = (1, 2);
                while mask < p2 {
                    let partner = rank[me ^ mask];
                    send_step(partner, tag(seq, step), pod_bytes(v));
                    let n = v.len();
                    recv_with(partner, tag(seq, step), n, |o: &[T]| combine(v, o));
                    mask <<= 1;
                    step += 1;
                }
            }
        }
        if me < extra {
            send_step(rank[me + p2], tag(seq, 1), pod_bytes(v));
        }
    }
}

/// Sends `send` to process `to` and receives `recv` (the same length
/// there) from process `from`, as one collective step: both sides call
/// it in the same place of their collective sequence. `to == from ==
/// my_pe()` copies.
pub fn sendrecv<T: Pod>(to: usize, send: &[T], from: usize, recv: &mut [T]) {
    let seq = next_seq();
    let me = my_pe();
    if to == me && from == me {
        recv.copy_from_slice(send);
        return;
    }
    send_step(to, tag(seq, 0), pod_bytes(send));
    recv_into(from, tag(seq, 0), recv);
}

/// Recursive halving among members 0..p2 (a power of two), steps tagged
/// from `step0`: each round gives the partner half of the current range
/// and combines the half kept. Returns this member's final range (block
/// `me` of p2 equal ones) and the splits made, outermost first, for an
/// allgather to undo.
#[allow(clippy::type_complexity)]
fn halve<T: Pod>(v: &mut [T], me: usize, rank: &[usize], p2: usize, seq: u64, step0: u64, combine: &dyn Fn(&mut [T], &[T])) -> (std::ops::Range<usize>, Vec<((usize, usize), (usize, usize))>) {
    let (mut lo, mut hi) = (0, v.len());
    let mut splits = Vec::new();
    let mut mask = p2 >> 1;
    let mut step = step0;
    while mask > 0 {
        let partner = rank[me ^ mask];
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if me & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        send_step(partner, tag(seq, step), pod_bytes(&v[give.0..give.1]));
        recv_with(partner, tag(seq, step), keep.1 - keep.0, |o: &[T]| combine(&mut v[keep.0..keep.1], o));
        splits.push(((lo, hi), give));
        (lo, hi) = keep;
        mask >>= 1;
        step += 1;
    }
    (lo..hi, splits)
}

/// Reduce-scatter by recursive halving, then allgather by recursive
/// doubling, among members 0..p2 (a power of two).
fn rabenseifner<T: Pod>(v: &mut [T], me: usize, rank: &[usize], p2: usize, seq: u64, combine: &dyn Fn(&mut [T], &[T])) {
    let (mine, mut splits) = halve(v, me, rank, p2, seq, 100, combine);
    let (mut lo, mut hi) = (mine.start, mine.end);
    let mut step = 100 + splits.len() as u64;
    // Allgather: undo the halvings in reverse order.
    let mut mask = 1;
    while let Some(((plo, phi), give)) = splits.pop() {
        let partner = rank[me ^ mask];
        send_step(partner, tag(seq, step), pod_bytes(&v[lo..hi]));
        recv_into(partner, tag(seq, step), &mut v[give.0..give.1]);
        (lo, hi) = (plo, phi);
        mask <<= 1;
        step += 1;
    }
}

/// Copies `data` of process `root` into `data` of every process (all
/// pass the same length).
pub fn broadcast<T: Pod>(root: usize, data: &mut [T]) {
    let (me, n) = (my_pe(), pe_num());
    assert!(root < n, "broadcast from rank {root} of {n}");
    let seq = next_seq();
    if n == 1 || data.is_empty() {
        return;
    }
    let vr = (me + n - root) % n;
    let real = |v: usize| (v + root) % n;
    if std::mem::size_of_val(data) < long_bytes() || data.len() < n {
        // Binomial tree on relative ranks.
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                recv_into(real(vr - mask), tag(seq, 0), data);
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                send_step(real(vr + mask), tag(seq, 0), pod_bytes(data));
            }
            mask >>= 1;
        }
        return;
    }
    // van de Geijn: scatter block b to relative rank b, then ring allgather.
    let chunk = data.len().div_ceil(n);
    let len = data.len();
    let block = |b: usize| (b * chunk).min(len)..((b + 1) * chunk).min(len);
    let blocks = |a: usize, b: usize| block(a).start..block(b.min(n) - 1).end;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let r = blocks(vr, vr + mask);
            recv_into(real(vr - mask), tag(seq, 1), &mut data[r]);
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            let r = blocks(vr + mask, vr + 2 * mask);
            send_step(real(vr + mask), tag(seq, 1), pod_bytes(&data[r]));
        }
        mask >>= 1;
    }
    let (left, right) = (real((vr + n - 1) % n), real((vr + 1) % n));
    for step in 0..n - 1 {
        let send_b = (vr + n - step) % n;
        let recv_b = (vr + n - step - 1) % n;
        let t = tag(seq, 2 + step as u64);
        send_step(right, t, pod_bytes(&data[block(send_b)]));
        recv_into(left, t, &mut data[block(recv_b)]);
    }
}
