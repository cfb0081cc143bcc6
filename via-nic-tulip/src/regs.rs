//! The 2114x control and status registers (CSRs) this driver uses.
//!
//! DEC 21143 Hardware Reference Manual, chapter 3 ("CSRs"): sixteen 32-bit
//! registers, CSRn at byte offset 8·n of either BAR (I/O or memory), always
//! accessed 32 bits wide.

/// Byte offset of CSR `n` in the BAR.
pub const fn csr(n: u64) -> u64 {
    n * 8
}

/// CSR0, bus mode.
pub const BUS_MODE: u64 = csr(0);
/// CSR1, transmit poll demand: any write makes the NIC scan the transmit
/// ring. This is the doorbell.
pub const TX_POLL: u64 = csr(1);
/// CSR2, receive poll demand.
pub const RX_POLL: u64 = csr(2);
/// CSR3, receive list base address (32-bit bus address).
pub const RX_LIST: u64 = csr(3);
/// CSR4, transmit list base address.
pub const TX_LIST: u64 = csr(4);
/// CSR5, status (write 1 to clear).
pub const STATUS: u64 = csr(5);
/// CSR6, operating mode.
pub const OP_MODE: u64 = csr(6);
/// CSR7, interrupt enable.
pub const INT_ENABLE: u64 = csr(7);
/// CSR9, boot ROM / serial ROM / MII management.
pub const SROM_MII: u64 = csr(9);

/// CSR0 software reset.
pub const BUS_MODE_SWR: u32 = 1 << 0;
/// CSR0 value after reset on x86, as the Linux driver programs it:
/// cache alignment 32 longwords, programmable burst 32, descriptor skip 0.
pub const BUS_MODE_X86: u32 = 0x01A0_8000;

/// CSR5 bits (§3.2.2.6).
pub mod status {
    pub const TI: u32 = 1 << 0;
    pub const TU: u32 = 1 << 2;
    pub const RI: u32 = 1 << 6;
    pub const RU: u32 = 1 << 7;
    pub const AIS: u32 = 1 << 15;
    pub const NIS: u32 = 1 << 16;
    /// Every write-1-to-clear bit (0..=16 except the reserved ones).
    pub const CLEAR_ALL: u32 = 0x0001_ffff;
}

/// CSR6 bits (§3.2.2.7).
pub mod op_mode {
    /// Start/stop receive.
    pub const SR: u32 = 1 << 1;
    /// Promiscuous.
    pub const PR: u32 = 1 << 6;
    /// Start/stop transmit.
    pub const ST: u32 = 1 << 13;
}

/// CSR7: what this driver enables. Receive interrupts (normal summary) and
/// receive-buffer-unavailable (abnormal summary) wake a sleeping process;
/// transmit completion is polled, not interrupted.
pub const INTERRUPTS: u32 = status::RI | status::NIS | status::RU | status::AIS;

/// CSR9 serial-ROM bits (§3.2.2.10).
pub mod srom {
    pub const CS: u32 = 1 << 0;
    pub const SK: u32 = 1 << 1;
    pub const DI: u32 = 1 << 2;
    pub const DO: u32 = 1 << 3;
    /// Serial ROM select.
    pub const SR: u32 = 1 << 11;
    /// Read operation.
    pub const RD: u32 = 1 << 14;
}
