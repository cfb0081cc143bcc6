//! The setup frame (21143 HRM §4.2.3): a 192-byte frame, sent through the
//! transmit ring with TDES1.SET, that loads the NIC's address filter. In
//! perfect filtering mode it holds 16 addresses of 12 bytes each; every
//! 16-bit half of an address sits in the low half of a 32-bit longword
//! (bytes 0-1 of each 4), the high half is ignored.

use via_device::MacAddr;

pub const SETUP_FRAME_LEN: usize = 192;

/// A perfect-filter setup frame accepting `own` and broadcast. Unused
/// slots repeat the broadcast address, as the Linux driver does.
pub fn perfect_filter(own: MacAddr) -> [u8; SETUP_FRAME_LEN] {
    let mut f = [0u8; SETUP_FRAME_LEN];
    for slot in 0..16 {
        let mac = if slot == 0 { own } else { MacAddr::BROADCAST };
        for half in 0..3 {
            let at = slot * 12 + half * 4;
            f[at] = mac.0[half * 2];
            f[at + 1] = mac.0[half * 2 + 1];
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How the NIC reads entry `n` back (the same layout, from the other side).
    fn entry(f: &[u8], n: usize) -> [u8; 6] {
        let o = n * 12;
        [f[o], f[o + 1], f[o + 4], f[o + 5], f[o + 8], f[o + 9]]
    }

    #[test]
    fn slot_zero_is_our_address_and_the_rest_broadcast() {
        let mac = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        let f = perfect_filter(mac);
        assert_eq!(f.len(), 192);
        assert_eq!(entry(&f, 0), mac.0);
        for n in 1..16 {
            assert_eq!(entry(&f, n), [0xff; 6]);
        }
        // The high halves of every longword stay zero.
        for lw in f.chunks(4) {
            assert_eq!(&lw[2..], &[0, 0]);
        }
    }
}
