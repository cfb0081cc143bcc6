//! VIA in UDP/IPv4 on a host: the nftables rule that keeps the kernel's
//! own IP stack off VIA's UDP port (`via-agent udp-port`).
//!
//! The provider takes its datagrams from an AF_PACKET socket
//! (`via_softnic::udp`); the kernel's IP stack sees each of them as well,
//! routes it, looks up the UDP socket that holds the port and drops it
//! there. That work is paid on the receiving host for every datagram, in
//! the softirq of its arrival (over veth, on the sending core): 0.4-0.6 us
//! of a 64-byte one-way message here (DESIGN-NOTES, "Large messages and VIA
//! over UDP/IPv4"). A RoCE v2 NIC consumes its UDP port in hardware; this
//! rule is the software provider's way of saying the same: datagrams to
//! the port and to this host are dropped at the IP layer's first hook
//! (`prerouting`, priority `raw`). Packet sockets took their copies before
//! that hook, so the provider still gets every one.
//!
//! Only datagrams addressed to one of this host's own addresses are
//! dropped (`fib daddr type local`): a host that routes VIA datagrams for
//! others forwards them as before. The table is named after the port, so
//! the rules of several ports live side by side; installing is idempotent.
//! It needs `nft` (Debian: nftables) and CAP_NET_ADMIN in the namespace.

use crate::netns::nft;

/// The nftables table that holds the rule for `port`.
pub fn table(port: u16) -> String {
    format!("via_udp_{port}")
}

/// The ruleset that installs (or reinstalls) the rule for `port`: the
/// table made if absent, emptied, and its chain and rule declared.
pub fn ruleset(port: u16) -> String {
    let t = table(port);
    format!(
        "table ip {t} {{}}\n\
         flush table ip {t}\n\
         table ip {t} {{\n\
         \tchain prerouting {{\n\
         \t\ttype filter hook prerouting priority raw; policy accept;\n\
         \t\tudp dport {port} fib daddr type local drop\n\
         \t}}\n\
         }}\n"
    )
}

/// Installs the rule for `port` in namespace `netns` (None: this
/// process's).
pub fn install(netns: Option<&str>, port: u16) -> Result<(), String> {
    nft(netns, &["-f", "-"], &ruleset(port)).map(drop)
}

/// Removes the rule for `port`; removing one that is not there is no error.
pub fn remove(netns: Option<&str>, port: u16) -> Result<(), String> {
    if installed(netns, port)? {
        nft(netns, &["delete", "table", "ip", &table(port)], "").map(drop)?;
    }
    Ok(())
}

/// Is the rule for `port` installed in namespace `netns`?
pub fn installed(netns: Option<&str>, port: u16) -> Result<bool, String> {
    let tables = nft(netns, &["list", "tables", "ip"], "")?;
    let want = format!("table ip {}", table(port));
    Ok(tables.lines().any(|l| l.trim() == want))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_drops_only_the_ports_datagrams_to_this_host() {
        let r = ruleset(34997);
        assert!(r.starts_with("table ip via_udp_34997 {}\nflush table ip via_udp_34997\n"), "{r}");
        assert!(r.contains("type filter hook prerouting priority raw; policy accept;"), "{r}");
        assert!(r.contains("udp dport 34997 fib daddr type local drop"), "{r}");
        assert_eq!(r.matches("drop").count(), 1, "one rule, nothing else dropped: {r}");
        assert_eq!(table(9), "via_udp_9");
    }
}
