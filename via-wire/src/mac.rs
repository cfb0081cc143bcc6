//! Ethernet MAC addresses: parsing, printing and the broadcast address;
//! and the addresses of hosts reached over UDP/IPv4, which take the same
//! six bytes (an IPv4 identity: [`MacAddr::for_ipv4`]).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// The first two bytes of an IPv4 identity: "VI", a locally administered
/// unicast prefix.
const IPV4_PREFIX: [u8; 2] = [0x56, 0x49];

/// A 48-bit IEEE 802 MAC address, or a host's IPv4 identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// The identity of the host at `ip` on a UDP/IPv4 network: what VIA
    /// names a peer by when its frames travel in UDP datagrams (device
    /// `udp:<ifname>`), where Ethernet addresses change at every router.
    /// It is `56:49` ("VI", locally administered) and the four octets, and
    /// prints and parses as the dotted quad.
    pub const fn for_ipv4(ip: Ipv4Addr) -> MacAddr {
        let o = ip.octets();
        MacAddr([IPV4_PREFIX[0], IPV4_PREFIX[1], o[0], o[1], o[2], o[3]])
    }

    /// The IPv4 address of an IPv4 identity.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let b = self.0;
        (b[..2] == IPV4_PREFIX).then(|| Ipv4Addr::new(b[2], b[3], b[4], b[5]))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(ip) = self.ipv4() {
            return write!(f, "{ip}");
        }
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error for a string that is not `xx:xx:xx:xx:xx:xx` (or a dotted quad).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMac(pub String);

impl fmt::Display for BadMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a MAC address (want xx:xx:xx:xx:xx:xx, or an IPv4 address a.b.c.d): {:?}", self.0)
    }
}

impl std::error::Error for BadMac {}

impl FromStr for MacAddr {
    type Err = BadMac;
    fn from_str(s: &str) -> Result<Self, BadMac> {
        if let Ok(ip) = s.trim().parse::<Ipv4Addr>() {
            return Ok(MacAddr::for_ipv4(ip));
        }
        let mut out = [0u8; 6];
        let mut parts = s.trim().split([':', '-']);
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(|| BadMac(s.into()))?;
            if p.is_empty() || p.len() > 2 {
                return Err(BadMac(s.into()));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| BadMac(s.into()))?;
        }
        if parts.next().is_some() {
            return Err(BadMac(s.into()));
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parse_and_print() {
        let m: MacAddr = "02:0a:FF:00:01:9c".parse().unwrap();
        assert_eq!(m.0, [2, 10, 255, 0, 1, 0x9c]);
        assert_eq!(m.to_string(), "02:0a:ff:00:01:9c");
        assert!("02:0a:ff:00:01".parse::<MacAddr>().is_err());
        assert!("02:0a:ff:00:01:9c:00".parse::<MacAddr>().is_err());
        assert!("zz:0a:ff:00:01:9c".parse::<MacAddr>().is_err());
    }

    #[test]
    fn ipv4_identities_print_and_parse_as_dotted_quads() {
        let m = MacAddr::for_ipv4(Ipv4Addr::new(10, 7, 0, 2));
        assert_eq!(m.0, [0x56, 0x49, 10, 7, 0, 2]);
        assert_eq!(m.to_string(), "10.7.0.2");
        assert_eq!("10.7.0.2".parse::<MacAddr>().unwrap(), m);
        assert_eq!("56:49:0a:07:00:02".parse::<MacAddr>().unwrap(), m);
        assert_eq!(m.ipv4(), Some(Ipv4Addr::new(10, 7, 0, 2)));
        assert_eq!("02:0a:ff:00:01:9c".parse::<MacAddr>().unwrap().ipv4(), None);
        assert!("10.7.0".parse::<MacAddr>().is_err());
    }
}
