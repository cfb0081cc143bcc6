//! Memory registration and protection tags.
//!
//! The registration table maps a memory handle (`VIP_MEM_HANDLE`, the only
//! handle the NIC sees) to a registered region: its address range, the
//! protection tag it belongs to and its RDMA enable bits. Handles index the
//! table directly (low 16 bits) and carry 16 random bits above that, so a
//! stale or forged handle is refused without a search. Protection tags are
//! kept with a use count so that a tag still referenced by a region or a VI
//! cannot be destroyed.

use std::fmt;

/// A protection tag (`VIP_PROTECTION_HANDLE`): an opaque nonzero id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ptag(pub u32);

/// `VIP_MEM_ATTRIBUTES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemAttributes {
    pub ptag: Ptag,
    pub enable_rdma_write: bool,
    pub enable_rdma_read: bool,
}

/// One registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub handle: u32,
    pub addr: usize,
    pub len: usize,
    pub attrs: MemAttributes,
}

impl Region {
    /// Does `[addr, addr + len)` lie inside the region?
    #[inline]
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        // Below the region the offset wraps past its length: two compares,
        // no overflow (a region never reaches the end of the address space).
        let off = addr.wrapping_sub(self.addr);
        off <= self.len && len <= self.len - off
    }
}

/// Why a registration-table operation or an access check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemError {
    /// No such handle (never issued, deregistered, or forged).
    BadHandle,
    /// The address does not match the handle's region.
    BadAddress,
    /// The range leaves the region.
    OutOfBounds,
    /// The region's protection tag differs from the one required.
    PtagMismatch,
    /// No such protection tag.
    BadPtag,
    /// The tag is still used by a region or a VI.
    PtagInUse,
    /// The table is full.
    TooManyRegions,
    /// Zero-length or address-space-wrapping registration.
    BadLength,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemError::BadHandle => "unknown or stale memory handle",
            MemError::BadAddress => "address does not belong to the memory handle",
            MemError::OutOfBounds => "range extends past the registered region",
            MemError::PtagMismatch => "protection tag of the region does not match",
            MemError::BadPtag => "unknown protection tag",
            MemError::PtagInUse => "protection tag still in use",
            MemError::TooManyRegions => "registration table full (MaxRegisterRegions)",
            MemError::BadLength => "registration length is zero or wraps the address space",
        })
    }
}

impl std::error::Error for MemError {}

/// Most regions one NIC handle may register.
pub const MAX_REGIONS: usize = 65_534;
/// Most protection tags one NIC handle may create.
pub const MAX_PTAGS: usize = 4096;

/// The registration table of one opened NIC.
#[derive(Default)]
pub struct RegistrationTable {
    regions: Vec<Option<Region>>,
    free: Vec<usize>,
    ptags: Vec<Option<(Ptag, usize)>>,
    registered_bytes: usize,
    /// Changes that can fail a check that passed before (a region gone or
    /// re-tagged, a VI re-tagged): see [`RegistrationTable::epoch`].
    changes: u64,
}

fn slot_of(handle: u32) -> Option<usize> {
    (handle & 0xffff).checked_sub(1).map(|s| s as usize)
}

impl RegistrationTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a protection tag.
    pub fn create_ptag(&mut self) -> Result<Ptag, MemError> {
        let slot = match self.ptags.iter().position(Option::is_none) {
            Some(s) => s,
            None if self.ptags.len() < MAX_PTAGS => {
                self.ptags.push(None);
                self.ptags.len() - 1
            }
            None => return Err(MemError::TooManyRegions),
        };
        let tag = Ptag(((random_u32() | 1) << 16) | (slot as u32 + 1));
        self.ptags[slot] = Some((tag, 0));
        Ok(tag)
    }

    fn ptag_slot(&self, tag: Ptag) -> Result<usize, MemError> {
        let s = slot_of(tag.0).ok_or(MemError::BadPtag)?;
        match self.ptags.get(s) {
            Some(Some((t, _))) if *t == tag => Ok(s),
            _ => Err(MemError::BadPtag),
        }
    }

    /// Destroys a tag that no region or VI uses.
    pub fn destroy_ptag(&mut self, tag: Ptag) -> Result<(), MemError> {
        let s = self.ptag_slot(tag)?;
        if self.ptags[s].unwrap().1 != 0 {
            return Err(MemError::PtagInUse);
        }
        self.ptags[s] = None;
        Ok(())
    }

    /// Counts one more user (a VI) of `tag`.
    pub fn acquire_ptag(&mut self, tag: Ptag) -> Result<(), MemError> {
        let s = self.ptag_slot(tag)?;
        self.ptags[s].as_mut().unwrap().1 += 1;
        Ok(())
    }

    /// Drops one user of `tag`.
    pub fn release_ptag(&mut self, tag: Ptag) {
        if let Ok(s) = self.ptag_slot(tag) {
            let e = self.ptags[s].as_mut().unwrap();
            e.1 = e.1.saturating_sub(1);
        }
    }

    /// Registers `[addr, addr + len)` and returns its handle.
    pub fn register(&mut self, addr: usize, len: usize, attrs: MemAttributes) -> Result<u32, MemError> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(MemError::BadLength);
        }
        self.acquire_ptag(attrs.ptag)?;
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.regions.len() < MAX_REGIONS => {
                self.regions.push(None);
                self.regions.len() - 1
            }
            None => {
                self.release_ptag(attrs.ptag);
                return Err(MemError::TooManyRegions);
            }
        };
        let handle = ((random_u32() | 1) << 16) | (slot as u32 + 1);
        self.regions[slot] = Some(Region { handle, addr, len, attrs });
        self.registered_bytes += len;
        Ok(handle)
    }

    /// The number of the table's current state of checks (never 0): a
    /// range that passed [`RegistrationTable::check`] passes it again,
    /// with the same tag, while this has not changed. Engines keep the
    /// ranges of posted descriptors as checked at post, with this number,
    /// and check again only when it moved.
    pub fn epoch(&self) -> u64 {
        self.changes + 1
    }

    /// Says that checks that passed may now fail for a reason outside the
    /// table (a VI's protection tag changed).
    pub fn invalidate_checks(&mut self) {
        self.changes += 1;
    }

    /// Removes the region `handle`, which must start at `addr`.
    pub fn deregister(&mut self, addr: usize, handle: u32) -> Result<Region, MemError> {
        let r = *self.lookup(handle)?;
        if r.addr != addr {
            return Err(MemError::BadAddress);
        }
        self.changes += 1;
        let s = slot_of(handle).unwrap();
        self.regions[s] = None;
        self.free.push(s);
        self.registered_bytes -= r.len;
        self.release_ptag(r.attrs.ptag);
        Ok(r)
    }

    /// The region of `handle`.
    #[inline]
    pub fn lookup(&self, handle: u32) -> Result<&Region, MemError> {
        let s = slot_of(handle).ok_or(MemError::BadHandle)?;
        match self.regions.get(s) {
            Some(Some(r)) if r.handle == handle => Ok(r),
            _ => Err(MemError::BadHandle),
        }
    }

    /// Changes a region's attributes (the new tag must exist).
    pub fn set_attributes(&mut self, addr: usize, handle: u32, attrs: MemAttributes) -> Result<(), MemError> {
        let r = *self.lookup(handle)?;
        if r.addr != addr {
            return Err(MemError::BadAddress);
        }
        self.acquire_ptag(attrs.ptag)?;
        self.release_ptag(r.attrs.ptag);
        self.changes += 1;
        let s = slot_of(handle).unwrap();
        self.regions[s].as_mut().unwrap().attrs = attrs;
        Ok(())
    }

    /// Checks that `[addr, addr + len)` lies in region `handle` whose tag is
    /// `ptag`; the check every descriptor segment goes through.
    #[inline]
    pub fn check(&self, handle: u32, addr: usize, len: usize, ptag: Ptag) -> Result<&Region, MemError> {
        let r = self.lookup(handle)?;
        if !r.contains(addr, len) {
            return Err(MemError::OutOfBounds);
        }
        if r.attrs.ptag != ptag {
            return Err(MemError::PtagMismatch);
        }
        Ok(r)
    }

    pub fn region_count(&self) -> usize {
        self.regions.len() - self.free.len()
    }

    pub fn registered_bytes(&self) -> usize {
        self.registered_bytes
    }
}

/// 32 random bits from the kernel (getrandom), for handles, endpoint ids
/// and connection generations.
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into the 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n != 4 {
        // Fall back to something that still differs between processes.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return (t.subsec_nanos() ^ std::process::id().rotate_left(16)) | 1;
    }
    u32::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(t: &mut RegistrationTable) -> MemAttributes {
        MemAttributes { ptag: t.create_ptag().unwrap(), enable_rdma_write: false, enable_rdma_read: false }
    }

    #[test]
    fn register_lookup_deregister() {
        let mut t = RegistrationTable::new();
        let a = attrs(&mut t);
        let h = t.register(0x1000, 0x2000, a).unwrap();
        assert!(t.check(h, 0x1000, 0x2000, a.ptag).is_ok());
        assert_eq!(t.check(h, 0x1000, 0x2001, a.ptag).unwrap_err(), MemError::OutOfBounds);
        assert_eq!(t.check(h, 0xfff, 1, a.ptag).unwrap_err(), MemError::OutOfBounds);
        assert_eq!(t.check(h, usize::MAX, 2, a.ptag).unwrap_err(), MemError::OutOfBounds);
        let other = t.create_ptag().unwrap();
        assert_eq!(t.check(h, 0x1000, 1, other).unwrap_err(), MemError::PtagMismatch);
        // forged: right slot, wrong random bits
        assert_eq!(t.lookup(h ^ 0x8000_0000).unwrap_err(), MemError::BadHandle);
        assert_eq!(t.destroy_ptag(a.ptag).unwrap_err(), MemError::PtagInUse);
        assert_eq!(t.deregister(0x1001, h).unwrap_err(), MemError::BadAddress);
        t.deregister(0x1000, h).unwrap();
        assert_eq!(t.lookup(h).unwrap_err(), MemError::BadHandle);
        t.destroy_ptag(a.ptag).unwrap();
        assert_eq!(t.destroy_ptag(a.ptag).unwrap_err(), MemError::BadPtag);
        assert_eq!(t.region_count(), 0);
    }

    #[test]
    fn handles_are_reused_with_new_bits() {
        let mut t = RegistrationTable::new();
        let a = attrs(&mut t);
        let h1 = t.register(0x1000, 16, a).unwrap();
        t.deregister(0x1000, h1).unwrap();
        let h2 = t.register(0x1000, 16, a).unwrap();
        assert_eq!(h1 & 0xffff, h2 & 0xffff);
        assert!(t.lookup(h1).is_err() || h1 == h2);
        assert_eq!(t.register(0, 0, a).unwrap_err(), MemError::BadLength);
    }
}
