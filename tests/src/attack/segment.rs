//! One Ethernet segment of three test hosts, A, B and M: a network
//! namespace each, joined through a Linux bridge in a fourth namespace
//! (the "hub"), all removed on drop.
//!
//! The bridge learns no addresses (learning off on every port), so it
//! floods every frame to every port, as a hub or a mirror port would: M
//! sees each frame A and B exchange, at once and without any poisoning
//! race, which makes the attacks deterministic.

use std::sync::atomic::{AtomicU32, Ordering};
use via_kernel_agent::netns::ip;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Which of the three hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Station {
    A,
    B,
    M,
}

impl Station {
    const ALL: [Station; 3] = [Station::A, Station::B, Station::M];

    fn letter(self) -> char {
        match self {
            Station::A => 'a',
            Station::B => 'b',
            Station::M => 'm',
        }
    }
}

/// The three hosts and the hub.
pub struct Segment {
    tag: String,
    hub: String,
}

impl Segment {
    /// Creates the hosts, the bridge and the links (MTU 1500).
    pub fn new() -> Segment {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root: it creates network namespaces and opens AF_PACKET sockets");
        }
        let tag = format!("{}y{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let seg = Segment { hub: format!("vxh{tag}"), tag };
        if let Err(e) = seg.build() {
            drop(seg);
            panic!("creating the three test hosts: {e}");
        }
        seg
    }

    fn build(&self) -> Result<(), String> {
        ip(&["netns", "add", &self.hub])?;
        ip(&["-n", &self.hub, "link", "add", "br0", "type", "bridge", "stp_state", "0"])?;
        ip(&["-n", &self.hub, "link", "set", "br0", "up"])?;
        for s in Station::ALL {
            let (ns, ifname, port) = (self.namespace(s), self.ifname(s), self.port(s));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &ifname, "mtu", "1500", "type", "veth", "peer", "name", &port, "mtu", "1500"])?;
            ip(&["link", "set", &ifname, "netns", &ns])?;
            ip(&["link", "set", &port, "netns", &self.hub])?;
            ip(&["-n", &self.hub, "link", "set", &port, "master", "br0"])?;
            // A hub: nothing learnt, every frame flooded to every port.
            ip(&["-n", &self.hub, "link", "set", &port, "type", "bridge_slave", "learning", "off"])?;
            ip(&["-n", &self.hub, "link", "set", &port, "up"])?;
            ip(&["-n", &ns, "link", "set", &ifname, "up"])?;
        }
        Ok(())
    }

    /// The namespace of host `s`.
    pub fn namespace(&self, s: Station) -> String {
        format!("vx{}{}", s.letter(), self.tag)
    }

    /// Host `s`'s interface (in its namespace).
    pub fn ifname(&self, s: Station) -> String {
        format!("x{}{}", s.letter(), self.tag)
    }

    fn port(&self, s: Station) -> String {
        format!("p{}{}", s.letter(), self.tag)
    }

    /// The VIA device name of host `s`'s interface.
    pub fn device(&self, s: Station) -> String {
        format!("/dev/via_{}", self.ifname(s))
    }

    /// Runs `f` on a thread inside host `s`'s namespace: what it opens
    /// there (a VIA device, an AF_PACKET socket) stays bound to that host.
    pub fn within<T: Send>(&self, s: Station, f: impl FnOnce() -> T + Send) -> T {
        crate::within(&self.namespace(s), f)
    }
}

impl Default for Segment {
    fn default() -> Self {
        Segment::new()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it and their peers.
        for s in Station::ALL {
            let _ = ip(&["netns", "del", &self.namespace(s)]);
        }
        let _ = ip(&["netns", "del", &self.hub]);
    }
}
