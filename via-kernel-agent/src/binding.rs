//! Handing a network PCI function to vfio-pci and back: the control-plane
//! half of the VFIO path (`via-agent bind` / `unbind`).
//!
//! Binding uses `driver_override` (Documentation/ABI/testing/sysfs-bus-pci):
//! unbind the current driver, name vfio-pci as the only driver the device
//! may take, ask the PCI core to probe it. Unbinding clears the override
//! and probes again so the kernel's own driver takes the device back.

use std::fs;
use std::io;
use std::path::Path;
use via_device::pci::{device, group_members, PciDevice, SYSFS_DEVICES};

/// Why a group cannot be used by vfio: the members bound to other drivers.
/// (PCI bridges bound to pcieport are allowed, as VFIO allows them.)
pub fn group_blockers(group: &str) -> io::Result<Vec<PciDevice>> {
    Ok(group_members(group)?
        .into_iter()
        .filter(|d| matches!(d.driver.as_deref(), Some(drv) if drv != "vfio-pci" && drv != "pcieport"))
        .collect())
}

fn write_sysfs(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied { " (needs root)" } else { "" };
        io::Error::new(e.kind(), format!("writing {value:?} to {}: {e}{hint}", path.display()))
    })
}

/// Hands `address` to vfio-pci and checks that its IOMMU group is usable.
pub fn bind(address: &str) -> io::Result<PciDevice> {
    let d = device(address)?;
    let Some(group) = d.iommu_group.clone() else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} has no IOMMU group: the IOMMU is off. Boot with intel_iommu=on (or amd_iommu=on) and try again", d.address),
        ));
    };
    if !Path::new("/sys/bus/pci/drivers/vfio-pci").exists() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "the vfio-pci driver is not loaded: run `modprobe vfio-pci` (as root) first"));
    }
    let dir = Path::new(SYSFS_DEVICES).join(&d.address);
    if d.driver.as_deref() != Some("vfio-pci") {
        if d.driver.is_some() {
            write_sysfs(&dir.join("driver").join("unbind"), &d.address)?;
        }
        write_sysfs(&dir.join("driver_override"), "vfio-pci")?;
        write_sysfs(Path::new("/sys/bus/pci/drivers_probe"), &d.address)?;
    }
    let d = device(&d.address)?;
    if d.driver.as_deref() != Some("vfio-pci") {
        return Err(io::Error::other(format!("{}: vfio-pci did not take the device (driver now {:?}); see dmesg", d.address, d.driver)));
    }
    let blockers = group_blockers(&group)?;
    if !blockers.is_empty() {
        let names: Vec<_> = blockers.iter().map(|b| format!("{} ({})", b.address, b.driver.as_deref().unwrap_or("-"))).collect();
        return Err(io::Error::other(format!(
            "{} is bound to vfio-pci, but IOMMU group {group} also holds {}, still bound to a kernel driver; bind those too (via-agent bind) or move the NIC to another slot",
            d.address,
            names.join(", ")
        )));
    }
    Ok(d)
}

/// Gives `address` back to the kernel's own driver.
pub fn unbind(address: &str) -> io::Result<PciDevice> {
    let d = device(address)?;
    let dir = Path::new(SYSFS_DEVICES).join(&d.address);
    if d.driver.is_some() {
        write_sysfs(&dir.join("driver").join("unbind"), &d.address)?;
    }
    write_sysfs(&dir.join("driver_override"), "\n")?;
    // The kernel driver may not exist (no tulip module): no driver is fine.
    let _ = write_sysfs(Path::new("/sys/bus/pci/drivers_probe"), &d.address);
    device(&d.address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_a_missing_device_is_a_clear_error() {
        for e in [bind("ffff:ff:1f.7").unwrap_err(), unbind("ffff:ff:1f.7").unwrap_err()] {
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert!(e.to_string().contains("no PCI device ffff:ff:1f.7"), "{e}");
        }
    }
}
