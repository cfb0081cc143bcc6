//! The name service: host names to MAC addresses, from a hosts file.
//!
//! The file named by `VIA_HOSTS` (default [`DEFAULT_HOSTS`]) holds lines of
//! `name MAC [DEVICE=MAC ...]`; `#` starts a comment. In place of a MAC an
//! IPv4 address names a host reached over UDP/IPv4 (device `udp:<ifname>`):
//! its IPv4 identity ([`MacAddr::for_ipv4`]). `VipNSGetHostByName`
//! looks names up here; a MAC written in place of a name resolves to itself.
//! The optional `DEVICE=MAC` fields are routes for composite devices: the
//! host whose identity is the first MAC is reached through the member
//! device named `DEVICE` (as in the composite's name, `/dev/via_eth1`), at
//! the second MAC on that device's network.

use via_wire::MacAddr;
use std::io;
use std::path::{Path, PathBuf};

pub const DEFAULT_HOSTS: &str = "/etc/via/hosts";

/// A parsed hosts file.
#[derive(Clone, Debug, Default)]
pub struct NameService {
    entries: Vec<(String, MacAddr)>,
    /// (identity, member device, address there).
    routes: Vec<(MacAddr, String, MacAddr)>,
    source: Option<PathBuf>,
}

impl NameService {
    /// The path the environment selects: `$VIA_HOSTS` or the default.
    pub fn default_path() -> PathBuf {
        std::env::var_os("VIA_HOSTS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_HOSTS))
    }

    /// Loads the default hosts file; a missing default file is an empty
    /// service (names then only resolve when written as MACs), a missing
    /// file named by `VIA_HOSTS` is an error.
    pub fn load_default() -> io::Result<NameService> {
        let p = Self::default_path();
        match Self::load(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && std::env::var_os("VIA_HOSTS").is_none() => Ok(NameService::default()),
            r => r,
        }
    }

    pub fn load(path: &Path) -> io::Result<NameService> {
        let text = std::fs::read_to_string(path).map_err(|e| io::Error::new(e.kind(), format!("hosts file {}: {e}", path.display())))?;
        let mut ns = Self::parse(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("hosts file {}: {e}", path.display())))?;
        ns.source = Some(path.to_path_buf());
        Ok(ns)
    }

    /// Parses hosts-file text; errors name the offending line.
    pub fn parse(text: &str) -> Result<NameService, String> {
        let (mut entries, mut routes) = (Vec::new(), Vec::new());
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(name), Some(mac)) = (f.next(), f.next()) else {
                return Err(format!("line {}: want `name MAC [DEVICE=MAC ...]`, got {line:?}", i + 1));
            };
            let mac: MacAddr = mac.parse().map_err(|e| format!("line {}: {e}", i + 1))?;
            for route in f {
                let Some((dev, there)) = route.split_once('=').filter(|(d, _)| !d.is_empty()) else {
                    return Err(format!("line {}: want DEVICE=MAC after the name and MAC, got {route:?}", i + 1));
                };
                let there: MacAddr = there.parse().map_err(|e| format!("line {}: {route}: {e}", i + 1))?;
                routes.push((mac, dev.to_string(), there));
            }
            entries.push((name.to_string(), mac));
        }
        Ok(NameService { entries, routes, source: None })
    }

    /// The MAC of `name` (or `name` itself parsed as a MAC).
    pub fn lookup(&self, name: &str) -> Option<MacAddr> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, m)| *m).or_else(|| name.parse().ok())
    }

    /// The first name of `mac`.
    pub fn name_of(&self, mac: MacAddr) -> Option<&str> {
        self.entries.iter().find(|(_, m)| *m == mac).map(|(n, _)| n.as_str())
    }

    /// Every name of `mac`, in file order.
    pub fn names_of(&self, mac: MacAddr) -> Vec<String> {
        self.entries.iter().filter(|(_, m)| *m == mac).map(|(n, _)| n.clone()).collect()
    }

    /// The routes through member `device` of a composite: (identity,
    /// address on that device's network), in file order.
    pub fn routes_through<'a>(&'a self, device: &'a str) -> impl Iterator<Item = (MacAddr, MacAddr)> + 'a {
        self.routes.iter().filter(move |(_, d, _)| d == device).map(|(id, _, there)| (*id, *there))
    }

    /// Every route of the file, for the composite devices opened with it.
    pub fn routes(&self) -> Vec<via_device::HostRoute> {
        self.routes.iter().map(|(identity, device, there)| via_device::HostRoute { identity: *identity, device: device.clone(), there: *there }).collect()
    }

    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lookup() {
        let ns = NameService::parse("# hosts\nalpha 02:00:00:00:00:01\n\n beta 02:00:00:00:00:02 # two\n").unwrap();
        assert_eq!(ns.lookup("alpha"), Some(MacAddr([2, 0, 0, 0, 0, 1])));
        assert_eq!(ns.lookup("beta"), Some(MacAddr([2, 0, 0, 0, 0, 2])));
        assert_eq!(ns.lookup("02:00:00:00:00:09"), Some(MacAddr([2, 0, 0, 0, 0, 9])));
        assert_eq!(ns.lookup("gamma"), None);
        assert_eq!(ns.name_of(MacAddr([2, 0, 0, 0, 0, 2])), Some("beta"));
        let e = NameService::parse("alpha\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = NameService::parse("a 02:00:00:00:00:01\nb zz\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn ipv4_addresses_name_hosts_reached_over_udp() {
        let ns = NameService::parse("far 10.2.0.2\n").unwrap();
        let id = MacAddr::for_ipv4(std::net::Ipv4Addr::new(10, 2, 0, 2));
        assert_eq!(ns.lookup("far"), Some(id));
        assert_eq!(ns.lookup("10.2.0.2"), Some(id));
        assert_eq!(ns.name_of(id), Some("far"));
    }

    #[test]
    fn routes_for_composite_members() {
        let ns = NameService::parse("far 02:00:00:00:00:02 /dev/via_eth1=02:00:00:00:01:02 tulip:0000:00:05.0=02:00:00:00:02:02\nnear 02:00:00:00:00:03\n").unwrap();
        assert_eq!(ns.lookup("far"), Some(MacAddr([2, 0, 0, 0, 0, 2])));
        let r: Vec<_> = ns.routes_through("/dev/via_eth1").collect();
        assert_eq!(r, vec![(MacAddr([2, 0, 0, 0, 0, 2]), MacAddr([2, 0, 0, 0, 1, 2]))]);
        assert_eq!(ns.routes_through("tulip:0000:00:05.0").count(), 1);
        assert_eq!(ns.routes_through("/dev/via_eth0").count(), 0);
        for bad in ["a 02:00:00:00:00:01 eth1", "a 02:00:00:00:00:01 =02:00:00:00:00:01", "a 02:00:00:00:00:01 eth1=zz"] {
            let e = NameService::parse(bad).unwrap_err();
            assert!(e.contains("line 1"), "{bad}: {e}");
        }
    }

    #[test]
    fn reverse_lookup_takes_the_first_entry() {
        let (m1, m2) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        let ns = NameService::parse("alpha 02:00:00:00:00:01
beta 02:00:00:00:00:02
alias 02:00:00:00:00:01
").unwrap();
        assert_eq!(ns.name_of(m1), Some("alpha"));
        assert_eq!(ns.names_of(m1), vec!["alpha".to_string(), "alias".to_string()]);
        assert_eq!(ns.name_of(m2), Some("beta"));
        assert_eq!(ns.name_of(MacAddr([2, 0, 0, 0, 0, 9])), None);
        assert!(ns.names_of(MacAddr([2, 0, 0, 0, 0, 9])).is_empty());
        assert_eq!(NameService::default().name_of(m1), None);
    }
}
