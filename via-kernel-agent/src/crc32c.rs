//! CRC-32C (Castagnoli), the frame checksum for devices that cannot vouch
//! for what they deliver (a software NIC has no Ethernet FCS check): the
//! SSE4.2 `crc32` instruction where the CPU has it, a table otherwise.
//! Incremental: `finish(update(update(START, a), b))` is the CRC of `a`
//! followed by `b`.

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

/// Feeds `bytes` into the running state `crc`.
pub fn update(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2 (checked just above).
            return unsafe { update_sse42(crc, bytes) };
        }
    }
    update_table(crc, bytes)
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn update_sse42(crc: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = crc as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, u64::from_le_bytes(w.try_into().unwrap()));
    }
    let mut c = c as u32;
    for &b in words.remainder() {
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
    }
}
