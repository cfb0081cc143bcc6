//! The killed-process check: two ranks streaming with DMA in flight are
//! killed, and the NICs must be left with no mapping and no bus mastering,
//! free to open, and open clean (see docs/DESIGN-NOTES.md). It runs on
//! every kind of NIC: what it reads of a NIC's own registers is read per
//! kind ([`NicState`]), the rest is the same for every VFIO device.

use super::*;

// What the kernel shows of a NIC from outside the process that owns it:
// its registers through the I/O BAR's sysfs file (port reads and writes,
// which no driver claim blocks, whereas sysfs maps a memory BAR only while
// no driver holds it), its PCI command register through sysfs config
// space, whether its VFIO group is free, and the memory the VFIO container
// pins. The IOMMU's page tables themselves are not visible: the Debian
// kernel has no CONFIG_IOMMU_DEBUGFS. What shows instead that the mappings
// went: type-1 VFIO pins every mapped page (accounted in the owner's
// VmLck) and unpins it only when it removes the mapping, so the pinned
// pages return to MemFree exactly when the mappings are gone; and a device
// that reached for an address with no mapping would leave a DMAR fault in
// the kernel log.

/// Bytes each `--forever` rank registers beyond its buffers, so that the
/// pages the container pins stand out of the noise in MemFree.
pub(crate) const PINNED_BALLAST: usize = 64 << 20;
/// The 21143 CSR bits these checks read (HRM §3.2.2.6 CSR5, §3.2.2.7 CSR6).
mod bits {
    /// CSR5: receive buffer unavailable, abnormal interrupt summary.
    pub const CSR5_RU: u32 = 1 << 7;
    pub const CSR5_AIS: u32 = 1 << 15;
    /// CSR6: receive and transmit processes started.
    pub const CSR6_SR: u32 = 1 << 1;
    pub const CSR6_ST: u32 = 1 << 13;
}

/// The 82574L registers these checks read (datasheet §10.2), and its I/O
/// BAR's window onto them (§10.1.3: write a register's offset to IOADDR,
/// then read it from IODATA).
mod e1000e {
    pub const IOADDR: u64 = 0x00;
    pub const IODATA: u64 = 0x04;
    /// Device status.
    pub const STATUS: u32 = 0x0008;
    /// Receive control; bit 1 (EN): the receiver is enabled.
    pub const RCTL: u32 = 0x0100;
    /// Transmit control; bit 1 (EN): the transmitter is enabled.
    pub const TCTL: u32 = 0x0400;
    pub const EN: u32 = 1 << 1;
}

/// One look at a NIC from outside: its registers that say whether its
/// receive and transmit DMA run, and bus mastering.
#[derive(Debug)]
struct NicState {
    /// The registers read, by name, for the log.
    regs: Vec<(&'static str, u32)>,
    /// Both DMA engines started.
    dma_started: bool,
    /// What the NIC still holds from an earlier owner, when its kind
    /// shows that from outside (None: nothing).
    pending: Option<String>,
    bus_master: bool,
}

impl std::fmt::Display for NicState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, v) in &self.regs {
            write!(f, "{name} {v:#010x} ")?;
        }
        write!(f, "bus master {}", self.bus_master)
    }
}

/// The index of the first I/O BAR of the PCI function whose sysfs
/// directory is `dir` (from its `resource` file: one line per BAR, start,
/// end and flags; flag 0x100 is IORESOURCE_IO).
fn io_bar(dir: &str) -> Result<usize, String> {
    let table = std::fs::read_to_string(format!("{dir}/resource")).map_err(|e| format!("{dir}/resource: {e}"))?;
    table
        .lines()
        .take(6)
        .position(|l| l.split_whitespace().nth(2).and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok()).is_some_and(|f| f & 0x100 != 0))
        .ok_or(format!("{dir} has no I/O BAR"))
}

impl NicState {
    /// Reads NIC `dev` (a VIA device name: its kind says which registers).
    fn read(dev: &str) -> Result<NicState, String> {
        use std::os::unix::fs::FileExt;
        let dir = format!("/sys/bus/pci/devices/{}", address_of(dev));
        let open = |file: &str, write: bool| std::fs::OpenOptions::new().read(true).write(write).open(format!("{dir}/{file}")).map_err(|e| format!("{dir}/{file}: {e}"));
        let read32 = |f: &std::fs::File, file: &str, off: u64| -> Result<u32, String> {
            let mut b = [0u8; 4];
            f.read_exact_at(&mut b, off).map_err(|e| format!("{dir}/{file} at {off:#x}: {e}"))?;
            Ok(u32::from_le_bytes(b))
        };
        // Config offset 4 is the command register (bit 2: bus master).
        let bus_master = read32(&open("config", false)?, "config", 4)? & 0x4 != 0;
        let io = format!("resource{}", io_bar(&dir)?);
        match kind_of(dev) {
            "tulip" => {
                // The I/O BAR holds the CSRs: CSRn at 8·n.
                let f = open(&io, false)?;
                let (csr5, csr6) = (read32(&f, &io, 0x28)?, read32(&f, &io, 0x30)?);
                // Both processes started, neither in state 0 (stopped):
                // CSR5 bits 19:17 (receive) and 22:20 (transmit), 21143
                // HRM §3.2.2.6.
                let (rs, ts) = ((csr5 >> 17) & 7, (csr5 >> 20) & 7);
                let dma_started = csr6 & (bits::CSR6_SR | bits::CSR6_ST) == bits::CSR6_SR | bits::CSR6_ST && rs != 0 && ts != 0;
                // An abnormal interrupt or a receive buffer unavailable
                // left over from the killed owner.
                let pending = (csr5 & (bits::CSR5_AIS | bits::CSR5_RU) != 0).then(|| format!("CSR5 {csr5:#010x}: abnormal interrupt summary or receive buffer unavailable"));
                Ok(NicState { regs: vec![("CSR5", csr5), ("CSR6", csr6)], dma_started, pending, bus_master })
            }
            "e1000e" => {
                // Through the I/O window (the only register this writes is
                // IOADDR, the window's own latch, which the driver, working
                // through the memory BAR, does not use).
                let f = open(&io, true)?;
                let reg = |r: u32| -> Result<u32, String> {
                    f.write_all_at(&r.to_le_bytes(), e1000e::IOADDR).map_err(|e| format!("{dir}/{io}: writing IOADDR: {e}"))?;
                    read32(&f, &io, e1000e::IODATA)
                };
                let (status, rctl, tctl) = (reg(e1000e::STATUS)?, reg(e1000e::RCTL)?, reg(e1000e::TCTL)?);
                let dma_started = rctl & e1000e::EN != 0 && tctl & e1000e::EN != 0;
                // What an old owner left pending is in the interrupt cause
                // register, which clears when read: not looked at from here.
                Ok(NicState { regs: vec![("STATUS", status), ("RCTL", rctl), ("TCTL", tctl)], dma_started, pending: None, bus_master })
            }
            k => Err(format!("{dev}: this check does not know the registers of a {k} NIC")),
        }
    }
}

/// Opens (and closes at once) the VFIO group of `addr`: Ok when no process
/// holds it, the open's error (EBUSY) when one does.
fn open_group(addr: &str) -> Result<std::io::Result<()>, String> {
    let group = pci::device(addr).map_err(|e| e.to_string())?.iommu_group.ok_or(format!("{addr} has no IOMMU group"))?;
    Ok(std::fs::OpenOptions::new().read(true).write(true).open(format!("/dev/vfio/{group}")).map(drop))
}

fn group_busy(addr: &str) -> Result<bool, String> {
    match open_group(addr)? {
        Ok(()) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(true),
        Err(e) => Err(format!("opening the VFIO group of {addr}: {e}")),
    }
}


/// Kernel log records after sequence number `after` that report an IOMMU
/// (DMAR) fault, and the last sequence number in the log.
fn dmar_faults(after: u64) -> Result<(u64, Vec<String>), String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut log = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg").map_err(|e| format!("/dev/kmsg: {e}"))?;
    let (mut last, mut faults, mut buf) = (after, Vec::new(), vec![0u8; 8192]);
    loop {
        // One record per read: "prio,seq,time,flags;message".
        let n = match log.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue, // overwritten under us
            Err(e) => return Err(format!("/dev/kmsg: {e}")),
        };
        let rec = String::from_utf8_lossy(&buf[..n]);
        let Some((head, msg)) = rec.split_once(';') else { continue };
        let seq: u64 = head.split(',').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        last = last.max(seq);
        if seq > after && msg.contains("DMAR") && msg.to_lowercase().contains("fault") {
            faults.push(msg.lines().next().unwrap_or_default().to_string());
        }
    }
    Ok((last, faults))
}

/// The next two `PROGRESS round rx_frames tx_frames` lines of a rank
/// (older ones dropped): Err unless its frame counters grew between them.
fn fresh_progress(rank: &mut Child2) -> Result<String, String> {
    rank.seen.extend(rank.lines.try_iter());
    let counts = |l: String| -> Vec<u64> { l.split_whitespace().filter_map(|w| w.parse().ok()).collect() };
    let a = counts(rank.expect("PROGRESS")?);
    let b = counts(rank.expect("PROGRESS")?);
    if a.len() != 3 || b.len() != 3 || b[1] <= a[1] || b[2] <= a[2] {
        return Err(format!("no traffic just before the kill: rounds, rx and tx frames {a:?} then {b:?}"));
    }
    Ok(format!("round {} rx {} tx {}", b[0], b[1], b[2]))
}

/// Two ranks streaming forever are killed with DMA under way. Then, before
/// anything reopens their NICs: bus mastering is off, the VFIO groups are
/// free, the pages their containers pinned are back in MemFree, and no
/// DMAR fault appeared. The next open resets the NIC (its processes
/// restarted, nothing pending) and a verified exchange passes.
pub(crate) fn killed_processes_leave_clean_nics(devs: &[String]) -> Result<(), String> {
    let addrs: Vec<String> = devs[..2].iter().map(|d| address_of(d).to_string()).collect();
    let ballast_kib = (PINNED_BALLAST / 1024) as u64;
    let free_before = via_tests::proc_kib("/proc/meminfo", "MemFree")?;
    let (log_start, _) = dmar_faults(0)?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut ranks = Vec::new();
    for (r, d) in devs[..2].iter().enumerate() {
        let mut c = Command::new(&me);
        c.args(["rank", &r.to_string(), d, "--forever"]);
        ranks.push(Child2::spawn(c)?);
    }
    let macs: Vec<String> = ranks.iter_mut().map(|r| r.expect("READY")).collect::<Result<_, _>>()?;
    for r in ranks.iter_mut() {
        r.tell(&format!("PEERS {}", macs.join(" ")));
    }
    for r in ranks.iter_mut() {
        r.expect("STREAMING")?;
    }
    // While they stream: each NIC's DMA engines run, it masters the bus,
    // its group is taken (the probes used after the kill see these), and
    // the container pins the rank's registered pages.
    for ((r, a), d) in ranks.iter().zip(&addrs).zip(devs) {
        let st = NicState::read(d)?;
        let locked = via_tests::proc_kib(&format!("/proc/{}/status", r.child.id()), "VmLck")?;
        println!("  {d} streaming: {st}; rank pins {locked} kB");
        if !st.dma_started || !st.bus_master {
            return Err(format!("{d} while its rank streams: {st}, expected both DMA engines started and bus mastering on"));
        }
        if !group_busy(a)? {
            return Err(format!("the VFIO group of {a} opened while its rank owns it"));
        }
        if locked < ballast_kib {
            return Err(format!("the rank on {a} has {locked} kB pinned (VmLck), less than the {ballast_kib} kB it registered"));
        }
    }
    let free_during = via_tests::proc_kib("/proc/meminfo", "MemFree")?;
    if free_before.saturating_sub(free_during) < ballast_kib * 3 / 2 {
        return Err(format!("MemFree {free_before} kB before the ranks, {free_during} kB while they pin 2 x {ballast_kib} kB: the pinned pages do not show"));
    }
    // Frames still flowing on both, then SIGKILL to both at once.
    for (k, r) in ranks.iter_mut().enumerate() {
        let p = fresh_progress(r)?;
        println!("  rank {k} just before the kill: {p}");
    }
    for r in ranks.iter_mut() {
        let _ = r.child.kill();
    }
    for r in ranks.iter_mut() {
        reap(&mut r.child)?;
    }
    // Reaped: the kernel ran the dead processes' file releases already.
    // (Every finding is reported, not only the first.)
    let mut leaks = Vec::new();
    for (a, d) in addrs.iter().zip(devs) {
        let st = NicState::read(d)?;
        println!("  {d} after the kill: {st}");
        if st.bus_master {
            leaks.push(format!("{a}: bus mastering still on after its process was killed"));
        }
        if group_busy(a)? {
            leaks.push(format!("{a}: its VFIO group is still busy after its process was killed and reaped"));
        }
    }
    let free_after = via_tests::proc_kib("/proc/meminfo", "MemFree")?;
    println!("  MemFree: {free_before} kB before, {free_during} kB streaming, {free_after} kB after the kill");
    if free_before.saturating_sub(free_after) > ballast_kib / 2 {
        leaks.push(format!("MemFree {free_after} kB after the kill, {free_before} kB before: pinned pages were not released"));
    }
    if !leaks.is_empty() {
        return Err(leaks.join("; "));
    }
    // The next open: a reset NIC, its DMA started afresh by the new owner
    // with nothing pending from the old one (where its kind shows that),
    // and counters that start at zero.
    for (d, a) in devs[..2].iter().zip(&addrs) {
        let nic = Nic::open(d).map_err(|e| format!("reopening {d}: {e}"))?;
        let st = NicState::read(d)?;
        if !st.dma_started || !st.bus_master {
            return Err(format!("{d} after the next open: {st}, expected both DMA engines started and bus mastering on"));
        }
        if let Some(p) = &st.pending {
            return Err(format!("{d} after the next open: {p}"));
        }
        if !group_busy(a)? {
            return Err(format!("the VFIO group of {a} opened while the suite owns the NIC"));
        }
        let busy: Vec<_> = nic.device_counters().into_iter().filter(|&(_, v)| v != 0).collect();
        if !busy.is_empty() {
            return Err(format!("{d} reopened with counters {busy:?}"));
        }
    }
    // The same NICs: a verified exchange must work, and at no point did
    // the NICs reach for an address without a mapping.
    pingpong(devs, &["--sizes", "0,1500,65536"])?;
    let (_, faults) = dmar_faults(log_start)?;
    if !faults.is_empty() {
        return Err(format!("IOMMU faults in the kernel log: {faults:?}"));
    }
    Ok(())
}

