//! Ethernet MAC addresses: parsing, printing and the broadcast address.

use std::fmt;
use std::str::FromStr;

/// A 48-bit IEEE 802 MAC address.
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
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error for a string that is not `xx:xx:xx:xx:xx:xx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMac(pub String);

impl fmt::Display for BadMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a MAC address (want xx:xx:xx:xx:xx:xx): {:?}", self.0)
    }
}

impl std::error::Error for BadMac {}

impl FromStr for MacAddr {
    type Err = BadMac;
    fn from_str(s: &str) -> Result<Self, BadMac> {
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
}
