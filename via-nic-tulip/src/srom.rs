//! Reading the serial ROM (a 93C46: 64 words of 16 bits, 6-bit addresses)
//! by bit-banging CSR9 (21143 HRM §3.2.2.10 and the 93C46 data sheet's READ
//! instruction), and the station address it holds.
//!
//! A READ is: chip select high; the start bit 1, the opcode 10 and the six
//! address bits shifted in on DI, each sampled on a rising SK; then sixteen
//! more clocks, each rising edge putting the next data bit (MSB first) on
//! DO; chip select low. The MAC is in words 10-12, low byte first.

use crate::regs::srom::{CS, DI, DO, RD, SK, SR};
use via_device::MacAddr;

/// Address bits of a 93C46.
pub const ADDR_BITS: u32 = 6;
/// First word of the station address.
pub const MAC_WORD: u8 = 10;

/// Access to CSR9, the only register the SROM protocol touches.
pub trait Csr9 {
    fn write(&mut self, v: u32);
    fn read(&mut self) -> u32;
}

const ENABLE: u32 = SR | RD;

/// Reads word `addr` (0..64).
pub fn read_word(bus: &mut dyn Csr9, addr: u8) -> u16 {
    let cmd: u32 = (0b110 << ADDR_BITS) | (u32::from(addr) & 0x3f);
    bus.write(ENABLE);
    bus.write(ENABLE | CS);
    for bit in (0..3 + ADDR_BITS).rev() {
        let di = if cmd >> bit & 1 == 1 { DI } else { 0 };
        bus.write(ENABLE | CS | di);
        bus.write(ENABLE | CS | di | SK);
        bus.write(ENABLE | CS | di);
    }
    let mut word = 0u16;
    for _ in 0..16 {
        bus.write(ENABLE | CS | SK);
        word = word << 1 | u16::from(bus.read() & DO != 0);
        bus.write(ENABLE | CS);
    }
    bus.write(ENABLE);
    word
}

/// The station address from words 10-12.
pub fn read_mac(bus: &mut dyn Csr9) -> MacAddr {
    let mut mac = [0u8; 6];
    for i in 0..3 {
        let w = read_word(bus, MAC_WORD + i as u8);
        mac[i * 2] = w as u8;
        mac[i * 2 + 1] = (w >> 8) as u8;
    }
    MacAddr(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 93C46 as its data sheet describes the READ instruction, wired to
    /// CSR9 as the 21143 wires it: it reacts only while SR is set, samples
    /// DI on rising SK, drives a dummy 0 after the last address bit and
    /// then one data bit per rising SK.
    struct Model93c46 {
        words: [u16; 64],
        csr9: u32,
        shift: u32,
        bits: u32,
        out: Option<(u16, u32)>,
        do_bit: bool,
        clocks: u32,
    }

    impl Model93c46 {
        fn new(words: [u16; 64]) -> Self {
            Model93c46 { words, csr9: 0, shift: 0, bits: 0, out: None, do_bit: false, clocks: 0 }
        }
    }

    impl Csr9 for Model93c46 {
        fn write(&mut self, v: u32) {
            let old = self.csr9;
            self.csr9 = v;
            if v & SR == 0 {
                return;
            }
            if v & CS == 0 {
                // Deselected: the next select starts a new instruction.
                self.shift = 0;
                self.bits = 0;
                self.out = None;
                self.do_bit = false;
                return;
            }
            if old & SK == 0 && v & SK != 0 {
                self.clocks += 1;
                if let Some((word, left)) = self.out {
                    if left > 0 {
                        self.do_bit = word >> (left - 1) & 1 == 1;
                        self.out = Some((word, left - 1));
                    }
                    return;
                }
                // Leading zeros before the start bit are ignored.
                if self.bits == 0 && v & DI == 0 {
                    return;
                }
                self.shift = self.shift << 1 | u32::from(v & DI != 0);
                self.bits += 1;
                if self.bits == 3 + ADDR_BITS {
                    let op = self.shift >> ADDR_BITS & 0b11;
                    assert_eq!(op, 0b10, "only READ is modelled");
                    let addr = (self.shift & 0x3f) as usize;
                    self.out = Some((self.words[addr], 16));
                    self.do_bit = false; // the dummy zero
                }
            }
        }

        fn read(&mut self) -> u32 {
            (self.csr9 & !DO) | if self.do_bit { DO } else { 0 }
        }
    }

    fn rom() -> [u16; 64] {
        let mut w = [0u16; 64];
        for (i, x) in w.iter_mut().enumerate() {
            *x = (i as u16).wrapping_mul(0x9e37) ^ 0x5a5a;
        }
        w
    }

    #[test]
    fn reads_every_word() {
        let words = rom();
        let mut m = Model93c46::new(words);
        for a in 0..64u8 {
            assert_eq!(read_word(&mut m, a), words[a as usize], "word {a}");
        }
        // 9 command clocks and 16 data clocks per word.
        assert_eq!(m.clocks, 64 * 25);
    }

    #[test]
    fn station_address_is_words_10_to_12_low_byte_first() {
        let mut words = rom();
        words[10] = 0x5452;
        words[11] = 0x1200;
        words[12] = 0x5634;
        let mut m = Model93c46::new(words);
        assert_eq!(read_mac(&mut m), MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]));
    }

    #[test]
    fn without_srom_select_nothing_answers() {
        struct Silent(u32);
        impl Csr9 for Silent {
            fn write(&mut self, v: u32) {
                self.0 = v;
            }
            fn read(&mut self) -> u32 {
                self.0 & !DO
            }
        }
        assert_eq!(read_word(&mut Silent(0), 10), 0);
    }
}
