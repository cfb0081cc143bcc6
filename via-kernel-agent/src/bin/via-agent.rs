//! `via-agent`: lists network PCI devices and hands VIA NICs to vfio-pci
//! and back.
//!
//! ```text
//! via-agent list              network devices: address, ids, driver, IOMMU group, VIA name
//! via-agent bind <pci>        unbind the kernel driver, bind vfio-pci, check the group
//! via-agent unbind <pci>      give the device back to its kernel driver
//! via-agent status            the VFIO prerequisites and every VIA NIC's state
//! via-agent udp-port [install|remove|status] [PORT]
//!                             VIA in UDP: keep the kernel's IP stack off the port
//!                             (an nftables rule in this namespace; default port 34997)
//! ```

use std::path::Path;
use std::process::exit;
use via_device::pci::{self, PciDevice};
use via_kernel_agent::{binding, udp_port};

fn usage() -> ! {
    eprintln!("usage: via-agent list | bind <pci address> | unbind <pci address> | status | udp-port [install|remove|status] [port]");
    exit(2)
}

fn die(e: impl std::fmt::Display) -> ! {
    eprintln!("via-agent: {e}");
    exit(1)
}

fn row(d: &PciDevice) -> String {
    format!(
        "{:<14} {:04x}:{:04x} {:<10} {:<6} {}",
        d.address,
        d.vendor,
        d.device,
        d.driver.as_deref().unwrap_or("-"),
        d.iommu_group.as_deref().unwrap_or("-"),
        d.via_name().unwrap_or_else(|| "-".into())
    )
}

fn list() {
    let devs = pci::list().unwrap_or_else(|e| die(format!("reading /sys/bus/pci/devices: {e}")));
    println!("{:<14} {:<9} {:<10} {:<6} VIA DEVICE", "ADDRESS", "IDS", "DRIVER", "GROUP");
    for d in &devs {
        println!("{}", row(d));
    }
    if devs.is_empty() {
        println!("(no network PCI devices)");
    }
}

/// What frames of processes started with this environment trust.
fn authentication() -> String {
    use via_kernel_agent::auth::{ClusterSecret, SECRET_ENV};
    match ClusterSecret::from_env() {
        Ok(Some(_)) => format!("on ({SECRET_ENV}={}): every frame carries a MAC under keys derived from the cluster secret; a host without it can neither inject nor forge connection management", std::env::var(SECRET_ENV).unwrap_or_default()),
        Ok(None) => format!(
            "OFF ({SECRET_ENV} unset): frames carry a CRC-32C, which has no key. Anyone who sees one frame of a connection can inject \
             into it: deliver sends as the peer, write into registered memory of a VI with RDMA write enabled, and take sequence \
             numbers so that the real frames are dropped as duplicates. Set {SECRET_ENV} to a 0600 secret file on every host"
        ),
        Err(e) => format!("REFUSED: {e}"),
    }
}

fn status() {
    let iommu = std::fs::read_dir("/sys/kernel/iommu_groups").map(|d| d.count()).unwrap_or(0);
    let vfio_pci = Path::new("/sys/bus/pci/drivers/vfio-pci").exists();
    let vfio_dev = Path::new("/dev/vfio/vfio").exists();
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("IOMMU groups:        {iommu}{}", if iommu == 0 { " (IOMMU off: boot with intel_iommu=on)" } else { "" });
    println!("vfio-pci loaded:     {}{}", yes(vfio_pci), if vfio_pci { "" } else { " (modprobe vfio-pci)" });
    println!("/dev/vfio/vfio:      {}", yes(vfio_dev));
    println!("frame authentication: {}", authentication());
    let devs = pci::list().unwrap_or_else(|e| die(format!("reading /sys/bus/pci/devices: {e}")));
    for d in devs.iter().filter(|d| d.via_driver().is_some()) {
        let state = match (&d.driver, &d.iommu_group) {
            (_, None) => "no IOMMU group".to_string(),
            (Some(drv), Some(g)) if drv == "vfio-pci" => match binding::group_blockers(g) {
                Ok(b) if b.is_empty() => {
                    if Path::new("/dev/vfio").join(g).exists() {
                        "ready".to_string()
                    } else {
                        format!("bound, but /dev/vfio/{g} is missing")
                    }
                }
                Ok(b) => format!("group {g} not viable: {} still bound to a kernel driver", b.iter().map(|x| x.address.as_str()).collect::<Vec<_>>().join(", ")),
                Err(e) => format!("group {g}: {e}"),
            },
            _ => "not bound to vfio-pci (via-agent bind)".to_string(),
        };
        println!("{}  {state}", row(d));
    }
}

/// `via-agent udp-port ACTION [PORT]`: the rule that keeps the kernel's
/// IP stack off VIA's UDP port on this host (`udp_port`).
fn udp_port_command(action: &str, port: Option<&str>) {
    let port = match port {
        None => via_wire::VIA_UDP_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).unwrap_or_else(|| die(format!("{p:?} is no UDP port"))),
    };
    match action {
        "install" => match udp_port::install(None, port) {
            Ok(()) => println!("UDP port {port}: datagrams to this host are dropped at the IP layer's first hook (table ip {}); VIA's packet sockets still take them", udp_port::table(port)),
            Err(e) => die(e),
        },
        "remove" => match udp_port::remove(None, port) {
            Ok(()) => println!("UDP port {port}: the kernel's IP stack processes its datagrams again"),
            Err(e) => die(e),
        },
        "status" => match udp_port::installed(None, port) {
            Ok(true) => println!("UDP port {port}: kept off the kernel's IP stack (table ip {})", udp_port::table(port)),
            Ok(false) => println!("UDP port {port}: the kernel's IP stack processes every VIA datagram too (via-agent udp-port install)"),
            Err(e) => die(e),
        },
        _ => usage(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["list"] => list(),
        ["status"] => status(),
        ["bind", addr] => match binding::bind(addr) {
            Ok(d) => println!("{} bound to vfio-pci (IOMMU group {}); open it as {}", d.address, d.iommu_group.as_deref().unwrap_or("?"), d.via_name().unwrap_or_else(|| "a VIA device".into())),
            Err(e) => die(e),
        },
        ["unbind", addr] => match binding::unbind(addr) {
            Ok(d) => println!("{} released (driver now {})", d.address, d.driver.as_deref().unwrap_or("none")),
            Err(e) => die(e),
        },
        ["udp-port"] => udp_port_command("install", None),
        ["udp-port", a @ ("install" | "remove" | "status")] => udp_port_command(a, None),
        ["udp-port", a @ ("install" | "remove" | "status"), port] => udp_port_command(a, Some(port)),
        ["udp-port", port] => udp_port_command("install", Some(port)),
        _ => usage(),
    }
}
