//! The port rule (`via_kernel_agent::udp_port`, `via-agent udp-port`) keeps
//! the kernel's own IP stack off VIA's UDP datagrams and nothing else:
//! VIA in UDP/IPv4 between two subnets through a router, the rule on the
//! receiving host b and on the router. b's kernel UDP layer sees none of
//! the datagrams (its socket on the port drops nothing, the namespace's UDP
//! counters stand still), while every message arrives intact both ways:
//! the packet sockets took their copies before the rule's hook, and the
//! router, for which the datagrams are not local, forwards them. Host a,
//! without the rule, counts every datagram its kernel processed, which is
//! what makes b's zero mean something; and once the rule is removed, b's
//! kernel processes them again. Two real hosts and a router (network
//! namespaces), one engine per host in this process. Needs root and nft.

use std::time::Duration;
use via_kernel_agent::udp_port;
use via_tests::{within, TestNet};
use via_user::{Config, Descriptor, MacAddr, MemAttributes, MemoryRegion, Nic, Op, Ptag, Reliability, Vi, ViAttributes};

const T: Option<Duration> = Some(Duration::from_secs(20));
const MSG: usize = 1000;
const PORT: u16 = via_softnic::VIA_UDP_PORT;

struct End {
    nic: Nic,
    vi: Vi,
    mem: MemoryRegion,
    ptag: Ptag,
}

fn open(ns: &str, ifname: &str) -> End {
    let name = format!("udp:{ifname}");
    let dev = within(ns, || via_user::open_device(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"));
    let nic = Nic::with_device(&name, dev, Config::default()).unwrap_or_else(|e| panic!("starting the engine on {name}: {e}"));
    let ptag = nic.create_ptag().unwrap();
    let a = ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 4096, ptag, enable_rdma_write: false, enable_rdma_read: false };
    let vi = nic.create_vi(&a, None, None).unwrap();
    let mem = MemoryRegion::new(&nic, 2 * 4096, 4096, MemAttributes { ptag, enable_rdma_write: false, enable_rdma_read: false }).unwrap();
    End { nic, vi, mem, ptag }
}

impl End {
    fn desc(&self, at: usize) -> Descriptor {
        let mut d = Descriptor::new(&self.nic, self.ptag, 1).unwrap();
        d.set_op(Op::SendRecv, &[(&self.mem, at..at + MSG)], None, false).unwrap();
        d
    }

    fn device_counter(&self, name: &str) -> u64 {
        self.nic.device_counters().iter().find(|(k, _)| *k == name).map(|p| p.1).unwrap_or_else(|| panic!("no device counter {name}"))
    }
}

/// Message `i` from `from`: bytes no other message has at its place.
fn message(from: u8, i: u32) -> Vec<u8> {
    (0..MSG as u32).map(|k| (k.wrapping_mul(31) ^ i.wrapping_mul(7) ^ u32::from(from) << 5) as u8).collect()
}

/// `n` messages from `tx` to `rx`, one at a time, each checked on arrival.
fn send_checked(tx: &mut End, rx: &mut End, from: u8, first: u32, n: u32) {
    for i in first..first + n {
        rx.vi.post_recv(rx.desc(4096)).unwrap();
        let m = message(from, i);
        tx.mem.write(0, &m).unwrap();
        tx.vi.post_send(tx.desc(0)).unwrap();
        let got = rx.vi.recv_wait(T).unwrap_or_else(|e| panic!("message {i} from host {from}: {e}"));
        assert_eq!((got.errors(), got.length() as usize), (0, MSG), "message {i} from host {from}: status {:#x}", got.status());
        let mut back = vec![0u8; MSG];
        rx.mem.read(4096, &mut back).unwrap();
        assert!(back == m, "message {i} from host {from} arrived changed");
        let sent = tx.vi.send_wait(T).unwrap();
        assert_eq!(sent.errors(), 0, "message {i} from host {from}: send status {:#x}", sent.status());
    }
}

/// The namespace's kernel UDP counters that a datagram for a socket which
/// drops it moves: `InDatagrams` + `InErrors` (`/proc/net/snmp`).
fn kernel_udp_in(net: &TestNet, ns: &str) -> u64 {
    let out = net.command(ns, "cat", &["/proc/net/snmp"]).output().expect("reading /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().expect("Udp header"), udp.next().expect("Udp values"));
    let field = |want: &str| {
        let at = names.split_whitespace().position(|n| n == want).unwrap_or_else(|| panic!("no Udp {want} in /proc/net/snmp"));
        values.split_whitespace().nth(at).unwrap().parse::<u64>().unwrap()
    };
    field("InDatagrams") + field("InErrors")
}

fn install(ns: &str) {
    udp_port::install(Some(ns), PORT).unwrap_or_else(|e| panic!("installing the port rule in {ns}: {e}"));
    assert!(udp_port::installed(Some(ns), PORT).unwrap(), "the rule is listed in {ns}");
}

#[test]
fn the_port_rule_keeps_the_kernels_ip_stack_off_vias_datagrams_and_nothing_else() {
    let net = TestNet::routed(1500);
    let router = net.router.clone().unwrap();
    install(&net.b);
    install(&router);
    // Installing again changes nothing (one rule, not two).
    install(&net.b);
    let listed = net.command(&net.b, "nft", &["list", "table", "ip", &udp_port::table(PORT)]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout).matches(" drop").count(), 1, "{}", String::from_utf8_lossy(&listed.stdout));

    let (mut a, mut b) = (open(&net.a, &net.va), open(&net.b, &net.vb));
    let (id_a, id_b) = (MacAddr::for_ipv4(net.ip_a().parse().unwrap()), MacAddr::for_ipv4(net.ip_b().parse().unwrap()));
    a.vi.connect_peer_request(id_b, b"a", b"b", T).unwrap();
    b.vi.connect_peer_request(id_a, b"b", b"a", T).unwrap();
    a.vi.connect_peer_wait().unwrap();
    b.vi.connect_peer_wait().unwrap();

    let (snmp_a, snmp_b) = (kernel_udp_in(&net, &net.a), kernel_udp_in(&net, &net.b));
    let n = 200;
    send_checked(&mut a, &mut b, 1, 0, n);
    send_checked(&mut b, &mut a, 2, 0, n);
    // b's kernel took none of them; a's, without the rule, took each of b's.
    assert_eq!(b.device_counter("kernel_udp_drops"), 0, "b's socket on the port dropped datagrams its kernel carried up");
    assert_eq!(kernel_udp_in(&net, &net.b), snmp_b, "b's kernel UDP layer counted datagrams");
    assert!(a.device_counter("kernel_udp_drops") >= u64::from(n), "a's kernel (no rule) processed b's datagrams: {}", a.device_counter("kernel_udp_drops"));
    assert!(kernel_udp_in(&net, &net.a) >= snmp_a + u64::from(n), "a's kernel UDP counters moved with b's datagrams");

    // Removed, the rule lets b's kernel see the datagrams again.
    udp_port::remove(Some(&net.b), PORT).unwrap();
    assert!(!udp_port::installed(Some(&net.b), PORT).unwrap());
    send_checked(&mut a, &mut b, 1, n, n);
    assert!(b.device_counter("kernel_udp_drops") >= u64::from(n), "without the rule b's kernel processes a's datagrams: {}", b.device_counter("kernel_udp_drops"));
    assert!(kernel_udp_in(&net, &net.b) >= snmp_b + u64::from(n));
    assert_eq!((a.nic.counters().rx_bad_checksum, b.nic.counters().rx_bad_checksum), (0, 0));
}
