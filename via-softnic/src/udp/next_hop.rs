//! The next hop of a datagram, from the kernel's own tables: the route to
//! the destination (`/proc/net/route`, the main table) and its gateway's
//! or its own Ethernet address (`/proc/net/arp`). Both files are opened
//! when the device is, from `/proc/thread-self`, so they stay those of the
//! opening thread's network namespace whichever thread sends later.
//!
//! A kernel UDP socket bound to the VIA port completes the picture. It
//! never carries data: it keeps the kernel from answering our datagrams
//! with ICMP "port unreachable", and when the neighbour table does not know
//! a next hop yet, an empty datagram sent through it to the destination
//! makes the kernel resolve it (ARP). The frame waits (the engine sends it
//! again) until the table has the address.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use via_device::MacAddr;

/// How long a resolved next hop is used before the tables are read again.
const REFRESH: Duration = Duration::from_secs(1);
/// Lookups between looks at the clock for [`REFRESH`].
const CLOCK_EVERY: u32 = 1024;
/// How long an unresolved next hop waits before the tables are read again.
const RETRY: Duration = Duration::from_millis(1);
/// How long a destination without a route waits before the routes are
/// read again.
const RETRY_UNREACHABLE: Duration = Duration::from_secs(1);
/// The least time between two probes to one destination.
const PROBE_EVERY: Duration = Duration::from_millis(100);

const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;
/// `/proc/net/arp` flags: the entry is complete (ATF_COM).
const ATF_COM: u32 = 0x2;

/// Where a datagram to a destination goes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hop {
    /// To this Ethernet address.
    Ready(MacAddr),
    /// Nowhere yet: the next hop is being resolved.
    Pending,
    /// No route through our interface.
    Unreachable,
}

struct Entry {
    dst: Ipv4Addr,
    hop: Hop,
    /// When `hop` was read from the tables.
    at: Instant,
    probed: Option<Instant>,
}

/// A route of the main table (addresses as the kernel prints them: the
/// network-order bytes as a native integer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Route {
    dst: u32,
    gateway: u32,
    flags: u32,
    mask: u32,
    metric: u32,
}

/// The next hops of one interface's datagrams.
pub(crate) struct NextHops {
    ifname: String,
    routes: File,
    arp: File,
    socket: OwnedFd,
    port: u16,
    /// Whether our socket holds the port (another may: then it answers).
    pub holds_port: bool,
    entries: Vec<Entry>,
    text: String,
    lookups: u32,
    pub probes: u64,
}

impl NextHops {
    /// Opens the tables of the calling thread's network namespace and the
    /// socket on `port`, for datagrams leaving through `ifname`.
    pub fn open(ifname: &str, port: u16) -> io::Result<NextHops> {
        let open = |what: &str| File::open(format!("/proc/thread-self/net/{what}")).map_err(|e| io::Error::new(e.kind(), format!("opening the kernel's {what} table (/proc/thread-self/net/{what}): {e}")));
        let (routes, arp) = (open("route")?, open("arp")?);
        let (socket, holds_port) = sys::port_socket(port)?;
        Ok(NextHops { ifname: ifname.to_string(), routes, arp, socket, port, holds_port, entries: Vec::new(), text: String::new(), lookups: 0, probes: 0 })
    }

    /// Datagrams to the port that the kernel's own IP stack carried up to
    /// our socket and dropped there (its drop count): each cost this host
    /// a route lookup, a socket lookup and the drop on top of the packet
    /// socket's copy. 0 while the port rule keeps the IP stack off the port
    /// (`via_kernel_agent::udp_port`, `via-agent udp-port`). With several
    /// VIA processes on the port, each socket counts its share.
    pub fn kernel_udp_drops(&self) -> u64 {
        sys::drops(&self.socket)
    }

    /// Where a datagram to `dst` goes now.
    pub fn lookup(&mut self, dst: Ipv4Addr) -> Hop {
        self.lookups = self.lookups.wrapping_add(1);
        let i = match self.entries.iter().position(|e| e.dst == dst) {
            Some(i) => i,
            None => {
                self.entries.push(Entry { dst, hop: Hop::Pending, at: Instant::now(), probed: None });
                let i = self.entries.len() - 1;
                self.resolve(i);
                return self.entries[i].hop;
            }
        };
        let e = &self.entries[i];
        let wait = match e.hop {
            Hop::Ready(_) if !self.lookups.is_multiple_of(CLOCK_EVERY) => return e.hop,
            Hop::Ready(_) => REFRESH,
            Hop::Pending => RETRY,
            Hop::Unreachable => RETRY_UNREACHABLE,
        };
        if e.at.elapsed() >= wait {
            self.resolve(i);
        }
        self.entries[i].hop
    }

    /// Reads the tables for entry `i`; probes if its next hop is unknown.
    fn resolve(&mut self, i: usize) {
        let now = Instant::now();
        let dst = self.entries[i].dst;
        let hop = match self.route_to(dst) {
            None => Hop::Unreachable,
            Some(via) => match self.neighbour(via) {
                Some(mac) => Hop::Ready(mac),
                None => {
                    let e = &mut self.entries[i];
                    if e.probed.is_none_or(|t| now.duration_since(t) >= PROBE_EVERY) {
                        e.probed = Some(now);
                        self.probes += 1;
                        sys::probe(&self.socket, dst, self.port);
                    }
                    Hop::Pending
                }
            },
        };
        let e = &mut self.entries[i];
        // A next hop known before stays in use while the kernel resolves
        // it again.
        if !(matches!(e.hop, Hop::Ready(_)) && hop == Hop::Pending) {
            e.hop = hop;
        }
        e.at = now;
    }

    fn read(file: &mut File, text: &mut String) -> bool {
        text.clear();
        file.rewind().and_then(|_| file.read_to_string(text)).is_ok()
    }

    /// The address to resolve for `dst`: its gateway, or itself on a
    /// directly attached network; None when the kernel's best route does
    /// not leave through our interface.
    fn route_to(&mut self, dst: Ipv4Addr) -> Option<Ipv4Addr> {
        if dst.is_broadcast() {
            return Some(dst);
        }
        if !Self::read(&mut self.routes, &mut self.text) {
            return None;
        }
        let (route, _) = best_route(&self.text, dst)?;
        (route.0 == self.ifname).then(|| if route.1.flags & RTF_GATEWAY != 0 { Ipv4Addr::from(route.1.gateway.to_ne_bytes()) } else { dst })
    }

    /// The Ethernet address of `ip` on our interface, if the kernel's
    /// neighbour table has it complete.
    fn neighbour(&mut self, ip: Ipv4Addr) -> Option<MacAddr> {
        if ip.is_broadcast() {
            return Some(MacAddr::BROADCAST);
        }
        if !Self::read(&mut self.arp, &mut self.text) {
            return None;
        }
        neighbour_in(&self.text, ip, &self.ifname)
    }
}

/// The kernel's choice for `dst` in `/proc/net/route` text: the longest
/// prefix, then the lowest metric; with its interface.
fn best_route(text: &str, dst: Ipv4Addr) -> Option<((&str, Route), u32)> {
    let d = u32::from_ne_bytes(dst.octets());
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let r = Route { dst: hex(f[1])?, gateway: hex(f[2])?, flags: hex(f[3])?, metric: f[6].parse().ok()?, mask: hex(f[7])? };
            (r.flags & RTF_UP != 0 && d & r.mask == r.dst).then_some(((f[0], r), r.mask.count_ones()))
        })
        .max_by(|(a, la), (b, lb)| la.cmp(lb).then(b.1.metric.cmp(&a.1.metric)))
}

/// The complete entry for `ip` on `ifname` in `/proc/net/arp` text.
fn neighbour_in(text: &str, ip: Ipv4Addr, ifname: &str) -> Option<MacAddr> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ok = f.len() >= 6 && f[0].parse() == Ok(ip) && f[5] == ifname && u32::from_str_radix(f[2].trim_start_matches("0x"), 16).is_ok_and(|fl| fl & ATF_COM != 0);
        ok.then(|| f[3].parse().ok()).flatten()
    })
}

/// The UDP socket's system calls, each confining its `unsafe`.
mod sys {
    use super::*;

    fn check(r: i32, what: &str) -> io::Result<i32> {
        if r < 0 {
            let e = io::Error::last_os_error();
            Err(io::Error::new(e.kind(), format!("{what}: {e}")))
        } else {
            Ok(r)
        }
    }

    fn set(fd: &OwnedFd, level: i32, name: i32, v: i32) -> io::Result<()> {
        // SAFETY: passes a live int and its size; the kernel only reads it.
        check(unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (&v as *const i32).cast(), 4) }, "setsockopt").map(drop)
    }

    fn sockaddr(ip: Ipv4Addr, port: u16) -> libc::sockaddr_in {
        libc::sockaddr_in { sin_family: libc::AF_INET as u16, sin_port: port.to_be(), sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) }, sin_zero: [0; 8] }
    }

    /// A UDP socket bound to `port` on every address (shared with the other
    /// VIA processes of the host, SO_REUSEPORT), with the least receive
    /// buffer: what reaches it is dropped. The bool says whether the bind
    /// took (another program may hold the port).
    pub fn port_socket(port: u16) -> io::Result<(OwnedFd, bool)> {
        // SAFETY: plain socket creation.
        let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) }, "creating the VIA port's UDP socket")?;
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        set(&fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        let _ = set(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 0);
        // Datagrams that arrive whole and marked for segmentation stay
        // whole (the kernel would otherwise cut them up to drop them).
        const UDP_GRO: i32 = 104;
        let _ = set(&fd, libc::SOL_UDP, UDP_GRO, 1);
        let a = sockaddr(Ipv4Addr::UNSPECIFIED, port);
        // SAFETY: passes a live sockaddr_in and its size.
        let bound = unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32) } == 0;
        Ok((fd, bound))
    }

    /// The socket's drop count (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`); 0 if
    /// the kernel does not say.
    pub fn drops(fd: &OwnedFd) -> u64 {
        const SO_MEMINFO: i32 = 55;
        const SK_MEMINFO_DROPS: usize = 8;
        let mut info = [0u32; 9];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `info`.
        let r = unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_MEMINFO, info.as_mut_ptr().cast(), &mut len) };
        if r == 0 && len as usize > SK_MEMINFO_DROPS * 4 {
            u64::from(info[SK_MEMINFO_DROPS])
        } else {
            0
        }
    }

    /// Sends an empty datagram to `dst`: the kernel resolves its next hop.
    pub fn probe(fd: &OwnedFd, dst: Ipv4Addr, port: u16) {
        let a = sockaddr(dst, port);
        // SAFETY: sends zero bytes to a live sockaddr_in of the given size.
        unsafe { libc::sendto(fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, (&a as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        va\t00000000\t0101000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        va\t0001000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        vx\t0009000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        vy\t0009000A\t00000000\t0001\t0\t0\t5\t00FFFFFF\t0\t0\t0\n\
        vz\t0000000B\t00000000\t0000\t0\t0\t0\t000000FF\t0\t0\t0\n";

    #[test]
    fn the_longest_prefix_wins_then_the_lowest_metric() {
        let via = |ip: [u8; 4]| best_route(ROUTES, Ipv4Addr::from(ip)).map(|((i, r), _)| (i, r.flags & RTF_GATEWAY != 0, Ipv4Addr::from(r.gateway.to_ne_bytes())));
        // On the attached network: direct.
        assert_eq!(via([10, 0, 1, 7]), Some(("va", false, Ipv4Addr::UNSPECIFIED)));
        // Elsewhere: the default route's gateway 10.0.1.1.
        assert_eq!(via([10, 0, 2, 2]), Some(("va", true, Ipv4Addr::new(10, 0, 1, 1))));
        // Two routes of one length: the lower metric.
        assert_eq!(via([10, 0, 9, 1]).unwrap().0, "vx");
        // A route that is not up is not taken.
        assert_eq!(via([11, 0, 0, 1]).unwrap().0, "va");
    }

    #[test]
    fn only_complete_entries_of_our_interface_count() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
            10.0.1.1         0x1         0x2         aa:bb:cc:dd:ee:01     *        va\n\
            10.0.1.3         0x1         0x0         00:00:00:00:00:00     *        va\n\
            10.0.1.4         0x1         0x2         aa:bb:cc:dd:ee:04     *        vb\n";
        assert_eq!(neighbour_in(arp, Ipv4Addr::new(10, 0, 1, 1), "va"), Some(MacAddr([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 1])));
        assert_eq!(neighbour_in(arp, Ipv4Addr::new(10, 0, 1, 3), "va"), None, "incomplete");
        assert_eq!(neighbour_in(arp, Ipv4Addr::new(10, 0, 1, 4), "va"), None, "another interface");
        assert_eq!(neighbour_in(arp, Ipv4Addr::new(10, 0, 1, 9), "va"), None);
    }
}
