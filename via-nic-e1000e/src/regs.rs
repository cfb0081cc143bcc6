//! The 82574 registers and bits this driver uses.
//!
//! Intel 82574 GbE Controller Family Datasheet, chapter 10 ("Driver
//! Programming Interface"): 32-bit registers in the memory BAR (BAR0,
//! 128 KiB), at the byte offsets of the register summary table. Section
//! names are given per register; each bit is that section's.

/// Device Control (CTRL, "Device Control Register").
pub const CTRL: u64 = 0x0000;
/// Device Status (STATUS, "Device Status Register").
pub const STATUS: u64 = 0x0008;
/// EEPROM Read (EERD, "EEPROM Read Register").
pub const EERD: u64 = 0x0014;
/// Interrupt Cause Read (ICR): causes are cleared by writing them back.
pub const ICR: u64 = 0x00C0;
/// Interrupt Throttling Rate (ITR): 0 turns throttling off.
pub const ITR: u64 = 0x00C4;
/// Interrupt Mask Set/Read (IMS).
pub const IMS: u64 = 0x00D0;
/// Interrupt Mask Clear (IMC).
pub const IMC: u64 = 0x00D8;
/// Receive Control (RCTL, "Receive Control Register").
pub const RCTL: u64 = 0x0100;
/// Transmit Control (TCTL, "Transmit Control Register").
pub const TCTL: u64 = 0x0400;
/// Transmit Inter Packet Gap (TIPG).
pub const TIPG: u64 = 0x0410;
/// Receive descriptor ring 0: base low/high, length in bytes, head, tail.
pub const RDBAL: u64 = 0x2800;
pub const RDBAH: u64 = 0x2804;
pub const RDLEN: u64 = 0x2808;
pub const RDH: u64 = 0x2810;
/// The receive tail: descriptors before it belong to the NIC.
pub const RDT: u64 = 0x2818;
/// Receive delay timer and absolute delay timer: 0 interrupts at once.
pub const RDTR: u64 = 0x2820;
pub const RADV: u64 = 0x282C;
/// Transmit descriptor ring 0: base low/high, length, head, tail.
pub const TDBAL: u64 = 0x3800;
pub const TDBAH: u64 = 0x3804;
pub const TDLEN: u64 = 0x3808;
pub const TDH: u64 = 0x3810;
/// The transmit tail: writing it is the doorbell.
pub const TDT: u64 = 0x3818;
/// Transmit interrupt delay value and absolute delay: 0 for none.
pub const TIDV: u64 = 0x3820;
pub const TADV: u64 = 0x382C;
/// Receive Checksum Control (RXCSUM): 0 turns the IP/TCP/UDP checksum
/// offloads off (VIA frames carry none of those headers).
pub const RXCSUM: u64 = 0x5000;
/// Multicast Table Array (128 words).
pub const MTA: u64 = 0x5200;
pub const MTA_WORDS: u64 = 128;
/// Receive Address 0, low and high ("Receive Address Low/High").
pub const RAL0: u64 = 0x5400;
pub const RAH0: u64 = 0x5404;

/// CTRL bits.
pub mod ctrl {
    /// Set Link Up.
    pub const SLU: u32 = 1 << 6;
    /// Device reset (self-clearing).
    pub const RST: u32 = 1 << 26;
}

/// STATUS bits.
pub mod status {
    /// Link up.
    pub const LU: u32 = 1 << 1;
}

/// EERD fields.
pub mod eerd {
    pub const START: u32 = 1 << 0;
    pub const DONE: u32 = 1 << 1;
    pub const ADDR_SHIFT: u32 = 2;
    pub const DATA_SHIFT: u32 = 16;
}

/// RCTL bits.
pub mod rctl {
    /// Receiver enable.
    pub const EN: u32 = 1 << 1;
    /// Broadcast accept mode.
    pub const BAM: u32 = 1 << 15;
    /// Strip the Ethernet CRC from received frames.
    pub const SECRC: u32 = 1 << 26;
    /// Long packet enable: frames over 1,522 bytes (jumbo frames).
    pub const LPE: u32 = 1 << 5;
    /// Buffer size extension: BSIZE counts in 16x larger units.
    pub const BSEX: u32 = 1 << 25;
    /// BSIZE (bits 17:16) = 01 with BSEX: 16,384-byte buffers.
    pub const BSIZE_16384: u32 = 0b01 << 16;
    // BSIZE = 00 with BSEX = 0: 2,048-byte buffers; DTYP = 00 and
    // RFCTL.EXSTEN = 0 (the reset values): legacy descriptors.
}

/// TCTL bits and fields.
pub mod tctl {
    /// Transmit enable.
    pub const EN: u32 = 1 << 1;
    /// Pad short packets.
    pub const PSP: u32 = 1 << 3;
    /// Collision threshold (bits 11:4), the datasheet's recommended 0x0F.
    pub const CT: u32 = 0x0F << 4;
    /// Collision distance (bits 21:12), 0x3F for full duplex.
    pub const COLD: u32 = 0x3F << 12;
}

/// The inter-packet gap the datasheet recommends for IEEE 802.3 (TIPG).
pub const TIPG_DEFAULT: u32 = 0x0060_2008;

/// Interrupt causes (ICR, IMS, IMC share the layout).
pub mod int {
    /// Receiver timer interrupt: a frame was written back (with RDTR = 0,
    /// at once).
    pub const RXT0: u32 = 1 << 7;
    /// Receiver overrun: a frame came with no free descriptor.
    pub const RXO: u32 = 1 << 6;
    /// Every cause.
    pub const ALL: u32 = u32::MAX;
}

/// RAH's address-valid bit.
pub const RAH_AV: u32 = 1 << 31;
