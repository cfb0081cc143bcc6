//! CRC-32C (Castagnoli), the frame checksum for devices that cannot vouch
//! for what they deliver (a software NIC has no Ethernet FCS check): the
//! SSE4.2 `crc32` instruction where the CPU has it and it is fast, eight
//! tables otherwise ("slicing by 8": eight bytes a step, loads and XORs).
//! Incremental: `finish(update(update(START, a), b))` is the CRC of `a`
//! followed by `b`.
//!
//! Which of the two a process uses is decided once, at its first CRC, by
//! timing both over 4 KiB ([`Implementation::chosen`]): a CPU that says it
//! has SSE4.2 may still run `crc32` slowly. QEMU's TCG emulates it one bit
//! at a time (64 steps an instruction), so in a TCG guest the instruction
//! took several times the tables' time, and a software NIC there would
//! pay for it on every frame at both ends. `VIA_CRC32C=sse42` or
//! `=tables` decides instead (both give the same CRC).
//!
//! The instruction takes 3 cycles and can start every cycle, so one
//! running CRC uses a third of it. Pieces of [`ROUND`] bytes and more
//! (and, for the rest, of [`SHORT_ROUND`]) are cut into three lanes
//! computed side by side, then joined: the raw state
//! is linear, so the CRC of `a` then `b` is the state after `a` advanced
//! over `|b|` zero bytes, XOR the state of `b` alone from zero. Advancing
//! over a lane's length is a 32x32 bit matrix, applied by four byte
//! tables ([`ShiftTables`]) built at compile time. Same results, about
//! 2.5x the speed on 56 KiB (`cargo bench -p via-wire --bench
//! crc32c`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// The state before any bytes.
pub const START: u32 = !0;

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Bytes of one lane of the three-lane loop (a multiple of 8); what is
/// left after it goes through lanes of [`SHORT_LANE`] bytes (MTU-1500
/// frames are shorter than one round of the long lanes).
const LANE: usize = 512;
const SHORT_LANE: usize = 128;
/// Bytes the three-lane loop takes at a time; shorter rests go in short
/// lanes, then one lane.
pub const ROUND: usize = 3 * LANE;
pub const SHORT_ROUND: usize = 3 * SHORT_LANE;

/// The raw state after `n` zero bytes from state `c` (linear in `c`).
const fn advance_over_zeros(mut c: u32, n: usize) -> u32 {
    let mut i = 0;
    while i < n {
        c = TABLE[(c & 0xff) as usize] ^ (c >> 8);
        i += 1;
    }
    c
}

/// "Advance the state over `n` zero bytes" as four tables, one per byte
/// of the state: the result is the XOR of the four entries.
struct ShiftTables([[u32; 256]; 4]);

impl ShiftTables {
    const fn over(n: usize) -> ShiftTables {
        // The matrix's columns: where each single state bit goes.
        let mut col = [0u32; 32];
        let mut i = 0;
        while i < 32 {
            col[i] = advance_over_zeros(1 << i, n);
            i += 1;
        }
        let mut t = [[0u32; 256]; 4];
        let mut k = 0;
        while k < 4 {
            let mut v = 0;
            while v < 256 {
                let mut x = 0;
                let mut j = 0;
                while j < 8 {
                    if v & (1 << j) != 0 {
                        x ^= col[8 * k + j];
                    }
                    j += 1;
                }
                t[k][v] = x;
                v += 1;
            }
            k += 1;
        }
        ShiftTables(t)
    }

    #[inline(always)]
    fn apply(&self, c: u32) -> u32 {
        let t = &self.0;
        t[0][(c & 0xff) as usize] ^ t[1][((c >> 8) & 0xff) as usize] ^ t[2][((c >> 16) & 0xff) as usize] ^ t[3][(c >> 24) as usize]
    }
}

/// Advancing over one lane and over two, for lanes of `lane` bytes.
struct LaneShifts {
    lane: usize,
    one: ShiftTables,
    two: ShiftTables,
}

impl LaneShifts {
    const fn for_lane(lane: usize) -> LaneShifts {
        LaneShifts { lane, one: ShiftTables::over(lane), two: ShiftTables::over(2 * lane) }
    }
}

static LONG: LaneShifts = LaneShifts::for_lane(LANE);
static SHORT: LaneShifts = LaneShifts::for_lane(SHORT_LANE);

/// Feeds `bytes` into the running state `crc`.
#[inline]
pub fn update(crc: u32, bytes: &[u8]) -> u32 {
    match Implementation::chosen() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only where the CPU has SSE4.2.
        Implementation::Sse42 => unsafe { update_sse42_any(crc, bytes) },
        _ => update_slices(crc, bytes),
    }
}

/// [`update`] through `imp` whatever was chosen (through the tables where
/// `imp` cannot run here): for benchmarks and checks that time both.
pub fn update_with(imp: Implementation, crc: u32, bytes: &[u8]) -> u32 {
    match imp {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has SSE4.2 (checked in the guard).
        Implementation::Sse42 if has_sse42() => unsafe { update_sse42_any(crc, bytes) },
        _ => update_slices(crc, bytes),
    }
}

/// [`update`] with one running CRC only: the baseline of the benchmark.
pub fn update_one_lane(crc: u32, bytes: &[u8]) -> u32 {
    match Implementation::chosen() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: chosen only where the CPU has SSE4.2.
        Implementation::Sse42 => unsafe { update_sse42(crc, bytes) },
        _ => update_slices(crc, bytes),
    }
}

/// How this process computes CRCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// The SSE4.2 `crc32` instruction, three lanes side by side.
    Sse42,
    /// Eight tables, eight bytes a step.
    Tables,
}

/// [`Implementation::chosen`]'s answer once known: 0 not yet, else the
/// implementation's code.
static CHOSEN: AtomicU8 = AtomicU8::new(0);

impl Implementation {
    /// The implementation of this process: `VIA_CRC32C` (`sse42` or
    /// `tables`) if set and possible here, else the faster of the two over
    /// 4 KiB, timed at the first call (the best of five tries each, taken
    /// in turns).
    #[inline]
    pub fn chosen() -> Implementation {
        match CHOSEN.load(Ordering::Relaxed) {
            1 => Implementation::Sse42,
            2 => Implementation::Tables,
            _ => Self::choose(),
        }
    }

    #[cold]
    #[inline(never)]
    fn choose() -> Implementation {
        let chosen = match std::env::var("VIA_CRC32C").ok().filter(|v| !v.is_empty()).as_deref() {
            Some("tables") => Implementation::Tables,
            Some("sse42") if has_sse42() => Implementation::Sse42,
            Some("sse42") => {
                eprintln!("VIA_CRC32C=sse42: this CPU has no SSE4.2; the CRC uses the tables");
                Implementation::Tables
            }
            Some(other) => {
                eprintln!("VIA_CRC32C={other}: expected sse42 or tables; the CRC uses the faster of the two, timed");
                Self::faster()
            }
            None => Self::faster(),
        };
        CHOSEN.store(if chosen == Implementation::Sse42 { 1 } else { 2 }, Ordering::Relaxed);
        chosen
    }

    /// The faster of the two over 4 KiB on this CPU (the tables where it
    /// has no SSE4.2).
    fn faster() -> Implementation {
        if !has_sse42() {
            return Implementation::Tables;
        }
        let data = [0x5au8; 4096];
        // Taken in turns, so that a stretch of noise (a vCPU the host took
        // away, an emulator translating new code) falls on both ways
        // rather than on all five tries of one: five in a row once made
        // the emulated instruction, 3.5 times slower, look the faster.
        let (mut sse42, mut tables) = (Duration::MAX, Duration::MAX);
        for _ in 0..5 {
            sse42 = sse42.min(timed(|| update_with(Implementation::Sse42, START, &data)));
            tables = tables.min(timed(|| update_with(Implementation::Tables, START, &data)));
        }
        if sse42 <= tables {
            Implementation::Sse42
        } else {
            Implementation::Tables
        }
    }
}

/// Does this CPU say it has the SSE4.2 `crc32` instruction?
pub fn has_sse42() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// How long one call of `f` takes.
fn timed(f: impl Fn() -> u32) -> Duration {
    let t = std::time::Instant::now();
    std::hint::black_box(f());
    t.elapsed()
}

/// The CRC of everything fed in.
pub fn finish(crc: u32) -> u32 {
    !crc
}

/// The CRC of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    finish(update(START, bytes))
}

fn update_table(mut crc: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// `SLICES[k][b]`: the state change of byte `b` followed by `k` zero
/// bytes, so that eight bytes are one lookup in each table.
static SLICES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    t[0] = TABLE;
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ TABLE[(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// Eight bytes a step through [`SLICES`], the rest a byte at a time.
fn update_slices(mut crc: u32, bytes: &[u8]) -> u32 {
    let t = &SLICES;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ crc;
        let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][(lo >> 8 & 0xff) as usize]
            ^ t[5][(lo >> 16 & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][(hi >> 8 & 0xff) as usize]
            ^ t[1][(hi >> 16 & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    update_table(crc, words.remainder())
}

/// The instruction's path for any length: one lane for a header or a
/// short payload, three lanes past [`SHORT_ROUND`].
///
/// # Safety
/// The CPU must have SSE4.2.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn update_sse42_any(crc: u32, bytes: &[u8]) -> u32 {
    // SAFETY: the caller's.
    unsafe {
        if bytes.len() < SHORT_ROUND {
            update_sse42(crc, bytes)
        } else {
            update_sse42_three_lanes(crc, bytes)
        }
    }
}

/// Long lanes while a [`ROUND`] is left, then short ones, then the rest
/// one lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn update_sse42_three_lanes(crc: u32, bytes: &[u8]) -> u32 {
    let (c, rest) = three_lanes::<LANE>(crc, bytes, &LONG);
    let (c, rest) = three_lanes::<SHORT_LANE>(c, rest, &SHORT);
    update_sse42(c, rest)
}

/// Three lanes of `L` bytes side by side while `3 * L` bytes are left,
/// each round joined with `shifts` (made for `L`); returns the state and
/// what is left.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn three_lanes<'a, const L: usize>(crc: u32, mut bytes: &'a [u8], shifts: &LaneShifts) -> (u32, &'a [u8]) {
    use std::arch::x86_64::_mm_crc32_u64;
    debug_assert_eq!(shifts.lane, L, "shift tables made for another lane length");
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().unwrap());
    let mut c = crc;
    while bytes.len() >= 3 * L {
        let (a, rest) = bytes.split_at(L);
        let (b, rest) = rest.split_at(L);
        let (z, rest) = rest.split_at(L);
        let (mut ca, mut cb, mut cz) = (u64::from(c), 0u64, 0u64);
        for ((x, y), w) in a.chunks_exact(8).zip(b.chunks_exact(8)).zip(z.chunks_exact(8)) {
            ca = _mm_crc32_u64(ca, word(x));
            cb = _mm_crc32_u64(cb, word(y));
            cz = _mm_crc32_u64(cz, word(w));
        }
        c = shifts.two.apply(ca as u32) ^ shifts.one.apply(cb as u32) ^ cz as u32;
        bytes = rest;
    }
    (c, bytes)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn update_sse42(crc: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().unwrap());
    let mut c = crc as u64;
    // Four words a round: a load and a crc32 each, one loop test per 32
    // bytes (headers and short payloads are a few rounds).
    let mut quads = bytes.chunks_exact(32);
    for q in &mut quads {
        c = _mm_crc32_u64(c, word(&q[0..8]));
        c = _mm_crc32_u64(c, word(&q[8..16]));
        c = _mm_crc32_u64(c, word(&q[16..24]));
        c = _mm_crc32_u64(c, word(&q[24..32]));
    }
    let mut words = quads.remainder().chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, word(w));
    }
    // The rest (under 8 bytes): a word of 4, one of 2, a byte.
    let mut c = c as u32;
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        c = _mm_crc32_u32(c, u32::from_le_bytes(rest[..4].try_into().unwrap()));
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        c = _mm_crc32_u16(c, u16::from_le_bytes(rest[..2].try_into().unwrap()));
        rest = &rest[2..];
    }
    if let Some(&b) = rest.first() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_pieces() {
        // The check value of CRC-32C (RFC 3720, B.4).
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
        assert_eq!(checksum(&[0u8; 32]), 0x8a91_36aa);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = checksum(&data);
        assert_eq!(finish(update(update(START, &data[..333]), &data[333..])), whole);
        assert_eq!(finish(update_table(START, &data)), whole, "table and instruction agree");
        assert_eq!(finish(update_slices(START, &data)), whole, "eight tables and one agree");
    }

    #[test]
    fn eight_tables_agree_with_one_at_every_length_and_state() {
        let data: Vec<u8> = (0..200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for len in 0..data.len() {
            for start in [START, 0, 0x1234_5678] {
                assert_eq!(update_slices(start, &data[..len]), update_table(start, &data[..len]), "length {len}, state {start:#x}");
            }
        }
    }

    #[test]
    fn the_choice_is_made_once_and_kept() {
        let first = Implementation::chosen();
        assert_eq!(Implementation::chosen(), first);
        if !has_sse42() {
            assert_eq!(first, Implementation::Tables, "no instruction to choose");
        }
    }

    #[test]
    fn three_lanes_agree_with_the_table_at_every_boundary() {
        let data: Vec<u8> = (0..4 * ROUND as u32 + 100).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let lengths = [0, 1, 7, 8, SHORT_ROUND - 1, SHORT_ROUND, SHORT_ROUND + 3, 2 * SHORT_ROUND, LANE, ROUND - 1, ROUND, ROUND + 1, ROUND + SHORT_ROUND + 8, 2 * ROUND - 1, 2 * ROUND, 3 * ROUND + 5, data.len()];
        // Every length to 80: rounds of 32, then words, then 4, 2, 1.
        for len in (0..=80).chain(lengths) {
            for start in [START, 0, 0x1234_5678] {
                let want = update_table(start, &data[..len]);
                assert_eq!(update(start, &data[..len]), want, "length {len}, state {start:#x}");
                assert_eq!(update_one_lane(start, &data[..len]), want, "length {len}, state {start:#x}");
                #[cfg(target_arch = "x86_64")]
                if has_sse42() {
                    // SAFETY: the CPU has SSE4.2. (Tested whichever `update` chose.)
                    assert_eq!(unsafe { update_sse42_any(start, &data[..len]) }, want, "length {len}, state {start:#x}");
                }
                assert_eq!(update_slices(start, &data[..len]), want, "length {len}, state {start:#x}");
            }
        }
        // Unaligned starts: the lanes read words from any address.
        for off in 1..8 {
            let want = update_table(START, &data[off..off + 2 * ROUND]);
            assert_eq!(update(START, &data[off..off + 2 * ROUND]), want, "offset {off}");
            assert_eq!(update_slices(START, &data[off..off + 2 * ROUND]), want, "offset {off}");
        }
    }

    #[test]
    fn shift_tables_advance_over_zeros() {
        for c in [1u32, 0x8000_0000, 0xdead_beef, !0] {
            for (shifts, lane) in [(&LONG, LANE), (&SHORT, SHORT_LANE)] {
                assert_eq!(shifts.one.apply(c), advance_over_zeros(c, lane));
                assert_eq!(shifts.two.apply(c), update_table(c, &vec![0u8; 2 * lane]));
            }
        }
    }
}
