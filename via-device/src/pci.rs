//! Network PCI functions as sysfs shows them (`/sys/bus/pci/devices`):
//! what drivers list to find their NICs and `via-agent` lists and binds
//! (handing a NIC to vfio-pci is the kernel agent's `binding`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where sysfs lists the PCI functions.
pub const SYSFS_DEVICES: &str = "/sys/bus/pci/devices";
/// PCI vendor id of Digital Equipment Corporation.
pub const VENDOR_DEC: u16 = 0x1011;
/// Device ids of the tulips the driver supports: 21140 and 21142/21143.
pub const TULIP_IDS: [u16; 2] = [0x0009, 0x0019];
/// PCI vendor id of Intel.
pub const VENDOR_INTEL: u16 = 0x8086;
/// Device id of the 82574L (e1000e), the part QEMU's `-device e1000e` models.
pub const E1000E_82574L: u16 = 0x10d3;

/// The NICs that have a VIA driver: (vendor, device, driver name). The
/// driver name is the prefix of the device's VIA name (`<driver>:<pci>`)
/// and of its numbered name (`/dev/via_<driver><N>`). A new driver is one
/// line here and one crate registering its opener.
pub const NIC_DRIVERS: [(u16, u16, &str); 3] = [(VENDOR_DEC, TULIP_IDS[0], "tulip"), (VENDOR_DEC, TULIP_IDS[1], "tulip"), (VENDOR_INTEL, E1000E_82574L, "e1000e")];

/// One PCI function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciDevice {
    /// Domain:bus:slot.function, e.g. `0000:00:03.0`.
    pub address: String,
    pub vendor: u16,
    pub device: u16,
    /// Class code (24 bits; 0x02xxxx is a network controller).
    pub class: u32,
    /// The bound kernel driver, if any.
    pub driver: Option<String>,
    /// The IOMMU group, when the IOMMU is on.
    pub iommu_group: Option<String>,
}

impl PciDevice {
    pub fn is_network(&self) -> bool {
        self.class >> 16 == 0x02
    }

    pub fn is_tulip(&self) -> bool {
        self.via_driver() == Some("tulip")
    }

    /// The VIA driver for this function ([`NIC_DRIVERS`]), if it has one.
    pub fn via_driver(&self) -> Option<&'static str> {
        NIC_DRIVERS.iter().find(|&&(v, d, _)| v == self.vendor && d == self.device).map(|&(_, _, name)| name)
    }

    /// The VIA device name a VIA program opens it by, for the NICs that
    /// have a VIA driver.
    pub fn via_name(&self) -> Option<String> {
        self.via_driver().map(|k| format!("{k}:{}", self.address))
    }
}

/// The PCI address a device name of VIA driver `driver` (a name of
/// [`NIC_DRIVERS`]) designates: `<driver>:<pci address>`, or
/// `/dev/via_<driver><N>`, the N-th such NIC by PCI address. `Some(Ok)`
/// for an address, `Some(Err)` for a numbered name past the NICs present,
/// `None` when the name is not one of the driver's.
pub fn address_of_name(driver: &str, name: &str) -> Option<io::Result<String>> {
    if let Some(a) = name.strip_prefix(driver).and_then(|r| r.strip_prefix(':')) {
        return Some(Ok(normalize_address(a)));
    }
    let n = name.strip_prefix("/dev/via_")?.strip_prefix(driver)?;
    let Ok(n) = n.parse::<usize>() else { return None };
    let nics: Vec<_> = list().unwrap_or_default().into_iter().filter(|d| d.via_driver() == Some(driver)).collect();
    Some(nics.get(n).map(|d| d.address.clone()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("there are {} {driver} NICs; {name} needs at least {} (see `via-agent list`)", nics.len(), n + 1))
    }))
}

/// `00:03.0` → `0000:00:03.0`; full addresses are returned as they are.
pub fn normalize_address(a: &str) -> String {
    if a.matches(':').count() == 1 {
        format!("0000:{a}")
    } else {
        a.to_string()
    }
}

fn read_hex(p: &Path) -> io::Result<u32> {
    let s = fs::read_to_string(p)?;
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p).ok()?.file_name()?.to_str().map(str::to_string)
}

/// Reads one device from sysfs.
pub fn device(address: &str) -> io::Result<PciDevice> {
    device_in(Path::new(SYSFS_DEVICES), address)
}

/// Reads one device from `devices`, a directory laid out like
/// `/sys/bus/pci/devices`.
fn device_in(devices: &Path, address: &str) -> io::Result<PciDevice> {
    let address = normalize_address(address);
    let dir = devices.join(&address);
    if !dir.exists() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("no PCI device {address} (`via-agent list` shows the network devices)")));
    }
    Ok(PciDevice {
        vendor: read_hex(&dir.join("vendor"))? as u16,
        device: read_hex(&dir.join("device"))? as u16,
        class: read_hex(&dir.join("class"))?,
        driver: link_name(&dir.join("driver")),
        iommu_group: link_name(&dir.join("iommu_group")),
        address,
    })
}

/// Every PCI function, sorted by address.
pub fn list_all() -> io::Result<Vec<PciDevice>> {
    list_all_in(Path::new(SYSFS_DEVICES))
}

/// Every PCI function of `devices` (laid out like `/sys/bus/pci/devices`),
/// sorted by address.
fn list_all_in(devices: &Path) -> io::Result<Vec<PciDevice>> {
    let mut v = Vec::new();
    for e in fs::read_dir(devices).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", devices.display())))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Ok(d) = device_in(devices, &name) {
            v.push(d);
        }
    }
    v.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(v)
}

/// The network PCI devices, sorted by address.
pub fn list() -> io::Result<Vec<PciDevice>> {
    list_in(Path::new(SYSFS_DEVICES))
}

fn list_in(devices: &Path) -> io::Result<Vec<PciDevice>> {
    Ok(list_all_in(devices)?.into_iter().filter(PciDevice::is_network).collect())
}

/// The devices in IOMMU group `group`.
pub fn group_members(group: &str) -> io::Result<Vec<PciDevice>> {
    let dir = PathBuf::from("/sys/kernel/iommu_groups").join(group).join("devices");
    let mut v = Vec::new();
    for e in fs::read_dir(&dir)? {
        v.push(device(&e?.file_name().to_string_lossy())?);
    }
    v.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names() {
        assert_eq!(normalize_address("00:03.0"), "0000:00:03.0");
        assert_eq!(normalize_address("0000:00:03.0"), "0000:00:03.0");
        let t = PciDevice { address: "0000:00:03.0".into(), vendor: 0x1011, device: 0x0019, class: 0x020000, driver: None, iommu_group: None };
        assert!(t.is_tulip() && t.is_network());
        assert_eq!(t.via_name().as_deref(), Some("tulip:0000:00:03.0"));
        let e1000 = PciDevice { vendor: 0x8086, device: 0x100e, ..t.clone() };
        assert!(!e1000.is_tulip() && e1000.via_name().is_none() && e1000.via_driver().is_none(), "the 82540EM (e1000) has no VIA driver");
        let e1000e = PciDevice { vendor: 0x8086, device: 0x10d3, ..t.clone() };
        assert!(!e1000e.is_tulip() && e1000e.via_driver() == Some("e1000e"));
        assert_eq!(e1000e.via_name().as_deref(), Some("e1000e:0000:00:03.0"));
    }

    #[test]
    fn missing_device_is_a_clear_error() {
        let e = device("ffff:ff:1f.7").unwrap_err();
        assert!(e.to_string().contains("no PCI device ffff:ff:1f.7"), "{e}");
    }

    /// A directory laid out like `/sys/bus/pci/devices`, removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(name: &str) -> FakeSysfs {
            let root = std::env::temp_dir().join(format!("via-pci-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("devices")).unwrap();
            fs::create_dir_all(root.join("drivers/tulip")).unwrap();
            fs::create_dir_all(root.join("iommu_groups/7")).unwrap();
            FakeSysfs(root)
        }

        fn devices(&self) -> PathBuf {
            self.0.join("devices")
        }

        /// One function as sysfs shows it (ids in the kernel's `0x%04x` form).
        fn add(&self, address: &str, vendor: u16, device: u16, class: u32, driver: Option<&str>, group: Option<&str>) {
            let dir = self.devices().join(address);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
            fs::write(dir.join("device"), format!("0x{device:04x}\n")).unwrap();
            fs::write(dir.join("class"), format!("0x{class:06x}\n")).unwrap();
            if let Some(d) = driver {
                std::os::unix::fs::symlink(self.0.join("drivers").join(d), dir.join("driver")).unwrap();
            }
            if let Some(g) = group {
                std::os::unix::fs::symlink(self.0.join("iommu_groups").join(g), dir.join("iommu_group")).unwrap();
            }
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn listing_reads_a_sysfs_tree() {
        let sys = FakeSysfs::new("list");
        sys.add("0000:00:04.0", 0x1011, 0x0019, 0x020000, Some("tulip"), Some("7"));
        sys.add("0000:00:01.0", 0x8086, 0x7000, 0x060100, None, None); // an ISA bridge
        sys.add("0000:00:03.0", 0x8086, 0x100e, 0x020000, None, None);
        // A function whose files cannot be read is left out, not fatal.
        fs::create_dir_all(sys.devices().join("0000:00:05.0")).unwrap();
        let all = list_all_in(&sys.devices()).unwrap();
        assert_eq!(all.iter().map(|d| d.address.as_str()).collect::<Vec<_>>(), ["0000:00:01.0", "0000:00:03.0", "0000:00:04.0"]);
        let net = list_in(&sys.devices()).unwrap();
        let tulip = PciDevice { address: "0000:00:04.0".into(), vendor: 0x1011, device: 0x0019, class: 0x020000, driver: Some("tulip".into()), iommu_group: Some("7".into()) };
        let e1000 = PciDevice { address: "0000:00:03.0".into(), vendor: 0x8086, device: 0x100e, class: 0x020000, driver: None, iommu_group: None };
        assert_eq!(net, [e1000, tulip.clone()]);
        assert_eq!(device_in(&sys.devices(), "00:04.0").unwrap(), tulip);
        let e = device_in(&sys.devices(), "00:09.0").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no PCI device 0000:00:09.0"), "{e}");
    }

    #[test]
    fn a_missing_sysfs_is_an_error_naming_it() {
        let sys = FakeSysfs::new("missing");
        let gone = sys.0.join("no-such-dir");
        let e = list_in(&gone).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no-such-dir"), "{e}");
    }

    #[test]
    fn listing_reads_this_machines_sysfs() {
        // Any Linux with sysfs has PCI devices to read (the tests run on
        // one): the list must succeed and agree with the directory.
        let entries: Vec<String> = fs::read_dir(SYSFS_DEVICES).expect("this machine has /sys/bus/pci/devices").map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        let all = list_all().expect("listing every PCI function");
        assert_eq!(all.len(), entries.len(), "every function of {SYSFS_DEVICES} is listed: {entries:?}");
        assert!(all.windows(2).all(|w| w[0].address < w[1].address), "sorted by address");
        for d in &all {
            let class = fs::read_to_string(Path::new(SYSFS_DEVICES).join(&d.address).join("class")).unwrap();
            assert_eq!(d.class, u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).unwrap(), "{}", d.address);
            let driver = fs::read_link(Path::new(SYSFS_DEVICES).join(&d.address).join("driver")).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
            assert_eq!(d.driver, driver, "{}", d.address);
        }
        let net = list().expect("listing the network functions");
        let want: Vec<PciDevice> = all.into_iter().filter(|d| d.class >> 16 == 0x02).collect();
        assert_eq!(net, want);
    }
}
