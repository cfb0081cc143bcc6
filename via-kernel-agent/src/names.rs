//! The name service: host names to MAC addresses, from a hosts file.
//!
//! The file named by `VIA_HOSTS` (default [`DEFAULT_HOSTS`]) holds lines of
//! `name MAC`; `#` starts a comment. `VipNSGetHostByName` looks names up
//! here; a MAC written in place of a name resolves to itself.

use crate::mac::MacAddr;
use std::io;
use std::path::{Path, PathBuf};

pub const DEFAULT_HOSTS: &str = "/etc/via/hosts";

/// A parsed hosts file.
#[derive(Clone, Debug, Default)]
pub struct NameService {
    entries: Vec<(String, MacAddr)>,
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
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(name), Some(mac), None) = (f.next(), f.next(), f.next()) else {
                return Err(format!("line {}: want `name MAC`, got {line:?}", i + 1));
            };
            let mac: MacAddr = mac.parse().map_err(|e| format!("line {}: {e}", i + 1))?;
            entries.push((name.to_string(), mac));
        }
        Ok(NameService { entries, source: None })
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
