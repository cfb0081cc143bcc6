//! The guest check that a too-low `RLIMIT_MEMLOCK` is a clear error: a
//! child process (`via-guest-suite memlock DEV`) without `CAP_IPC_LOCK`
//! opens a NIC under a limit just above what the NIC's rings pin, and
//! registers memory that fits and memory that does not. It holds for every
//! kind of NIC: what opening one pins is measured, not assumed (a tulip's
//! and an e1000e's rings differ).

use super::{stat, Child2};
use std::process::Command;
use via_device::memlock::{LockedMemory, CAP_IPC_LOCK};
use via_user::{MemAttributes, MemoryRegion, Nic, VipReturn};

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Bytes of each region that must fit under the limit.
const SMALL: usize = 64 * 1024;
/// Room left under the limit once the NIC is open.
const HEADROOM: u64 = 256 * 1024;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The suite's side: runs the child and shows what it saw.
pub fn memlock_too_low_names_the_limit(devs: &[String]) -> Result<(), String> {
    let mut c = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    c.args(["memlock", &devs[0]]);
    let out = Child2::spawn(c)?.finish()?;
    for l in out.lines().filter(|l| !l.is_empty()) {
        println!("  {l}");
    }
    Ok(())
}

/// Removes `CAP_IPC_LOCK` from this process's bounding, effective,
/// permitted and inheritable sets (it keeps `CAP_SYS_RESOURCE`, so it may
/// still set its own limits).
fn drop_ipc_lock() -> Result<(), String> {
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) } != 0 {
        return Err(err("prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK)"));
    }
    let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a version-3 header and room for its two words.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) } != 0 {
        return Err(err("capget"));
    }
    let keep = !(1u32 << CAP_IPC_LOCK);
    data[0].effective &= keep;
    data[0].permitted &= keep;
    data[0].inheritable &= keep;
    // SAFETY: capset with the header and the two words capget filled in.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(err("capset"));
    }
    Ok(())
}

/// Sets the soft and hard `RLIMIT_MEMLOCK` (`None`: unlimited).
fn set_memlock(bytes: Option<u64>) -> Result<(), String> {
    let v = bytes.unwrap_or(libc::RLIM_INFINITY);
    let r = libc::rlimit { rlim_cur: v, rlim_max: v };
    // SAFETY: setrlimit reads one `rlimit` from the local we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &r) } != 0 {
        return Err(format!("setrlimit(RLIMIT_MEMLOCK, {bytes:?}): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn locked() -> Result<u64, String> {
    LockedMemory::current().map(|m| m.locked).ok_or_else(|| "no VmLck in /proc/self/status".to_string())
}

/// The child's side, in a process of its own (the capabilities it drops do
/// not come back).
pub fn child(dev: &str) -> Result<(), String> {
    drop_ipc_lock()?;
    if LockedMemory::current().is_none_or(|m| m.ipc_lock) {
        return Err("CAP_IPC_LOCK is still effective after capset".into());
    }
    // What opening the NIC pins: measured without a limit.
    set_memlock(None)?;
    let base = locked()?;
    let rings = {
        let _nic = Nic::open(dev).map_err(|e| format!("opening {dev} without a limit: {e}"))?;
        locked()? - base
    };
    if locked()? != base || rings == 0 {
        return Err(format!("opening the NIC pinned {rings} bytes, and {} are locked after closing it (before: {base})", locked()?));
    }
    println!("CAP_IPC_LOCK dropped; opening {dev} pins {rings} bytes (its rings and buffers)");

    // A limit below that: the open fails and names it.
    let below = base + rings - 4096;
    set_memlock(Some(below))?;
    match Nic::open(dev) {
        Ok(_) => return Err(format!("{dev} opened under RLIMIT_MEMLOCK {below}, below the {rings} bytes its rings pin")),
        Err(e) if e.code == VipReturn::ErrorResource && e.message.contains("RLIMIT_MEMLOCK") && e.message.contains(&format!("is {below} bytes")) => println!("open under {below} bytes: {e}"),
        Err(e) => return Err(format!("opening under RLIMIT_MEMLOCK {below} failed without naming the limit, or not as VIP_ERROR_RESOURCE: {e}")),
    }
    if locked()? != base {
        return Err(format!("the failed open left {} bytes locked (before: {base})", locked()?));
    }

    // A limit just above: small regions fit, one larger than the limit not.
    let limit = base + rings + HEADROOM;
    set_memlock(Some(limit))?;
    let nic = Nic::open(dev).map_err(|e| format!("opening {dev} under RLIMIT_MEMLOCK {limit}: {e}"))?;
    let ptag = nic.create_ptag().map_err(|e| e.to_string())?;
    let attrs = MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false };
    let first = MemoryRegion::new(&nic, SMALL, 4096, attrs).map_err(|e| format!("registering {SMALL} bytes under RLIMIT_MEMLOCK {limit}: {e}"))?;
    let before = (locked()?, stat(&nic, "dma_mappings"));
    if before.1 != 1 {
        return Err(format!("{} IOMMU mappings with one region registered", before.1));
    }
    let big = 2 * limit as usize;
    let refused = match MemoryRegion::new(&nic, big, 4096, attrs) {
        Ok(_) => return Err(format!("registering {big} bytes succeeded under RLIMIT_MEMLOCK {limit} without CAP_IPC_LOCK")),
        Err(e) => e,
    };
    println!("registering {big} bytes under {limit}: {refused}");
    if refused.code != VipReturn::ErrorResource || !refused.message.contains("RLIMIT_MEMLOCK") || !refused.message.contains(&format!("is {limit} bytes")) {
        return Err(format!("expected VIP_ERROR_RESOURCE naming RLIMIT_MEMLOCK {limit}, got {refused}"));
    }
    let after = (locked()?, stat(&nic, "dma_mappings"));
    if after != before {
        return Err(format!("(locked bytes, IOMMU mappings) {before:?} before the refused registration, {after:?} after"));
    }
    let second = MemoryRegion::new(&nic, SMALL, 4096, attrs).map_err(|e| format!("registering {SMALL} bytes after the refused one: {e}"))?;
    let now = (locked()?, stat(&nic, "dma_mappings"));
    if now != (before.0 + SMALL as u64, before.1 + 1) {
        return Err(format!("(locked bytes, IOMMU mappings) {now:?} after a second {SMALL}-byte region, {before:?} before it"));
    }
    println!("after the refusal: (locked bytes, IOMMU mappings) {before:?} -> {after:?}; another {SMALL} bytes registered -> {now:?}");
    drop((first, second));
    Ok(())
}
