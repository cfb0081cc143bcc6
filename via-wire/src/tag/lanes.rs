//! AEGISMAC-128L of four frames at once (one frame a lane of AVX-512
//! registers), for batches of frames whose covered bytes have one length:
//! a message's fragments. Each lane's tag is the AEGISMAC-128L tag of its
//! own input (RFC 10032 section 7, the same as the `aegis` crate's
//! `Aegis128LMac` under the all-zero nonce), so a receiver checks a frame
//! alone or in a batch alike. Why: a tag's fixed cost (copying the key's
//! state, the seven finalization rounds, with 128X4 the lanes' merge) is
//! most of it on an MTU-sized frame; four frames side by side pay it once
//! and run the AES rounds four wide (VAES), as 128X4 does for one long
//! input (DESIGN-NOTES, "Frame authentication").
//!
//! The state update (AEGIS-128L, RFC 10032 section 4.2): eight 128-bit
//! blocks, each round `S'i = AESRound(S(i-1), Si)` with the two message
//! blocks XORed into S0 and S4. Here block i of the four states is one
//! 512-bit register, lane j holding frame j's. Needs AVX-512F with VAES,
//! found at run time; without them [`KeyState::new`] and [`tags4`]
//! answer `None` and callers tag one frame at a time.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{Tag, KEY_LEN, TAG_LEN};

/// Bytes of header every frame's covered bytes start with: the VIA
/// header, two 32-byte AEGIS-128L blocks.
pub const HEAD_LEN: usize = crate::VIA_HEADER_LEN;
const _: () = assert!(HEAD_LEN == 64);

/// AEGIS-128L's constants (RFC 10032 section 4.2).
const C0: [u8; 16] = [0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62];
const C1: [u8; 16] = [0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd];

/// The AEGIS-128L state after initialisation under a key and the
/// all-zero nonce: what every tag under that key starts from. (Not
/// `Debug`: it stands for the key, which is never printed.)
#[derive(Clone, Copy)]
pub struct KeyState([[u8; 16]; 8]);

impl KeyState {
    /// The state for `key`, or `None` on a CPU without the lanes
    /// ([`lanes_available`]: nothing would use it).
    pub fn new(key: &[u8; KEY_LEN]) -> Option<KeyState> {
        if !lanes_available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `lanes_available` found the CPU features `init4` is
            // compiled for.
            Some(unsafe { init4(key) })
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}

/// Can this CPU tag four lanes at once? (Asked once.)
pub fn lanes_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAVE: OnceLock<bool> = OnceLock::new();
        *HAVE.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("vaes"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The AEGISMAC-128L tags of four inputs, input j being `heads[j]`
/// ([`HEAD_LEN`] bytes) followed by `payloads[j]`, from the key state
/// `st`. The payloads must have one length (`None` otherwise, and on a
/// CPU without the lanes: [`lanes_available`]).
pub fn tags4(st: &KeyState, heads: [&[u8]; 4], payloads: [&[u8]; 4]) -> Option<[Tag; 4]> {
    let len = payloads[0].len();
    if !lanes_available() || payloads.iter().any(|p| p.len() != len) || heads.iter().any(|h| h.len() != HEAD_LEN) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `lanes_available` found the CPU features `tags4_vaes` is
        // compiled for; the slices' lengths were checked above.
        Some(unsafe { tags4_vaes(st, heads, payloads) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// AEGIS-128L's initialisation under `key` and the all-zero nonce
/// (RFC 10032 section 4.2.1), run in all four lanes alike; lane 0's state.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vaes")]
fn init4(key: &[u8; KEY_LEN]) -> KeyState {
    // SAFETY (the loads): 16-byte arrays, unaligned.
    let ld = |b: &[u8; 16]| _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(b.as_ptr().cast()) });
    let (k, c0, c1) = (ld(key), ld(&C0), ld(&C1));
    let n = _mm512_setzero_si512();
    let kn = _mm512_xor_si512(k, n);
    let mut s = [kn, c1, c0, c1, kn, _mm512_xor_si512(k, c0), _mm512_xor_si512(k, c1), _mm512_xor_si512(k, c0)];
    for _ in 0..10 {
        update4(&mut s, n, k);
    }
    let mut out = [[0u8; 16]; 8];
    for (o, v) in out.iter_mut().zip(s) {
        // SAFETY: a 16-byte array, unaligned store of lane 0.
        unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), _mm512_castsi512_si128(v)) };
    }
    KeyState(out)
}

/// One AEGIS-128L update of the four states `s` with the message blocks
/// `m0` and `m1` (lane j frame j's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vaes")]
#[inline]
fn update4(s: &mut [__m512i; 8], m0: __m512i, m1: __m512i) {
    let t7 = s[7];
    s[7] = _mm512_aesenc_epi128(s[6], s[7]);
    s[6] = _mm512_aesenc_epi128(s[5], s[6]);
    s[5] = _mm512_aesenc_epi128(s[4], s[5]);
    s[4] = _mm512_aesenc_epi128(s[3], _mm512_xor_si512(s[4], m1));
    s[3] = _mm512_aesenc_epi128(s[2], s[3]);
    s[2] = _mm512_aesenc_epi128(s[1], s[2]);
    s[1] = _mm512_aesenc_epi128(s[0], s[1]);
    s[0] = _mm512_aesenc_epi128(t7, _mm512_xor_si512(s[0], m0));
}

/// The 16 bytes at `at` of each of the four inputs `p`, lane j input j's.
///
/// # Safety
/// `at + 16 <= p[j].len()` for every j.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn gather(p: [&[u8]; 4], at: usize) -> __m512i {
    // SAFETY: the caller keeps `at + 16` within each input.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(p[0].as_ptr().add(at).cast()));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[1].as_ptr().add(at).cast()));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[2].as_ptr().add(at).cast()));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[3].as_ptr().add(at).cast()))
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vaes")]
fn tags4_vaes(st: &KeyState, heads: [&[u8]; 4], payloads: [&[u8]; 4]) -> [Tag; 4] {
    // SAFETY: 16-byte arrays, unaligned loads.
    let mut s: [__m512i; 8] = std::array::from_fn(|i| _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(st.0[i].as_ptr().cast()) }));
    // The header: two whole 32-byte blocks (lengths checked by `tags4`).
    for at in [0, 32] {
        // SAFETY: at + 32 <= HEAD_LEN.
        let (m0, m1) = unsafe { (gather(heads, at), gather(heads, at + 16)) };
        update4(&mut s, m0, m1);
    }
    let len = payloads[0].len();
    let whole = len - len % 32;
    let mut at = 0;
    while at < whole {
        // SAFETY: at + 32 <= whole <= len, every payload's length.
        let (m0, m1) = unsafe { (gather(payloads, at), gather(payloads, at + 16)) };
        update4(&mut s, m0, m1);
        at += 32;
    }
    if whole < len {
        // The last partial block, zero-padded.
        let mut pad = [[0u8; 32]; 4];
        for (b, p) in pad.iter_mut().zip(payloads) {
            b[..len - whole].copy_from_slice(&p[whole..]);
        }
        let padded: [&[u8]; 4] = std::array::from_fn(|j| &pad[j][..]);
        // SAFETY: each padded block has 32 bytes.
        let (m0, m1) = unsafe { (gather(padded, 0), gather(padded, 16)) };
        update4(&mut s, m0, m1);
    }
    // Finalize: t = S2 ^ (LE64(bits absorbed) || LE64(tag bits)), seven
    // updates with (t, t), the tag S0 ^ ... ^ S6.
    let bits = ((HEAD_LEN + len) as u64) * 8;
    let lens = _mm512_broadcast_i32x4(_mm_set_epi64x((TAG_LEN as u64 * 8) as i64, bits as i64));
    let t = _mm512_xor_si512(s[2], lens);
    for _ in 0..7 {
        update4(&mut s, t, t);
    }
    let mut x = s[0];
    for v in &s[1..7] {
        x = _mm512_xor_si512(x, *v);
    }
    let mut raw = [0u8; 64];
    // SAFETY: 64 bytes, unaligned store.
    unsafe { _mm512_storeu_si512(raw.as_mut_ptr().cast(), x) };
    std::array::from_fn(|j| raw[16 * j..16 * j + 16].try_into().expect("16 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aegis::aegis128l::Aegis128LMac;

    fn reference(key: &[u8; 16], head: &[u8], payload: &[u8]) -> Tag {
        let mut m = Aegis128LMac::<TAG_LEN>::new(key);
        m.update(head);
        m.update(payload);
        m.finalize()
    }

    #[test]
    fn each_lane_is_aegismac_128l_of_its_own_input() {
        let key = *b"fedcba9876543210";
        let Some(st) = KeyState::new(&key) else {
            eprintln!("no AVX-512 with VAES here: the lanes are not tested");
            return;
        };
        for len in [0usize, 1, 15, 16, 31, 32, 33, 64, 100, 639, 640, 1391, 1392, 1422, 2000] {
            let heads: Vec<Vec<u8>> = (0..4u8).map(|j| (0..HEAD_LEN as u8).map(|i| i ^ (j * 37)).collect()).collect();
            let payloads: Vec<Vec<u8>> = (0..4u32).map(|j| (0..len as u32).map(|i| (i * 7 + j * 91) as u8).collect()).collect();
            let tags = tags4(&st, std::array::from_fn(|j| &heads[j][..]), std::array::from_fn(|j| &payloads[j][..])).expect("lanes");
            for j in 0..4 {
                assert_eq!(tags[j], reference(&key, &heads[j], &payloads[j]), "lane {j}, {len} bytes");
            }
            // A flipped bit in one lane changes that lane's tag alone.
            if len > 0 {
                let mut p2 = payloads.clone();
                p2[2][len / 2] ^= 4;
                let t2 = tags4(&st, std::array::from_fn(|j| &heads[j][..]), std::array::from_fn(|j| &p2[j][..])).expect("lanes");
                assert_eq!((t2[0], t2[1], t2[3]), (tags[0], tags[1], tags[3]));
                assert_ne!(t2[2], tags[2]);
            }
        }
    }

    #[test]
    fn unequal_payloads_or_short_headers_are_refused() {
        let st = KeyState([[0; 16]; 8]);
        let h = [0u8; HEAD_LEN];
        let (a, b) = ([0u8; 10], [0u8; 11]);
        assert_eq!(tags4(&st, [&h[..]; 4], [&a[..], &a[..], &b[..], &a[..]]), None);
        assert_eq!(tags4(&st, [&h[..], &h[..1], &h[..], &h[..]], [&a[..]; 4]), None);
    }
}
