//! A connection's deciding side must not strand the answer that connects
//! the other side. Over UDP/IPv4 an answer can wait in the engine while
//! the kernel resolves its next hop; a program without the background
//! progress thread (MTTL's runtime) that goes on to block elsewhere once
//! its own wait returned would then leave it queued for good, and the
//! other side would never connect (`mttl-run -n 4 --udp` hung in about one
//! run in ten). Two real hosts (namespaces joined by a veth pair), one
//! engine on each, in this process. Needs root.

use std::sync::mpsc;
use std::time::{Duration, Instant};
use via_tests::{within, TestNet};
use via_user::{Config, MacAddr, Nic, Reliability, ViAttributes};

fn sysctl(net: &TestNet, ns: &str, setting: &str) {
    let out = net.command(ns, "sysctl", &["-qw", setting]).output().expect("running sysctl");
    assert!(out.status.success(), "sysctl {setting}: {}", String::from_utf8_lossy(&out.stderr));
}

fn ip(args: &[&str]) {
    via_kernel_agent::netns::ip(args).unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")));
}

/// Opens `udp:<ifname>` in namespace `ns` with the background progress
/// thread off, as MTTL opens its NIC.
fn open(ns: &str, ifname: &str) -> Nic {
    let name = format!("udp:{ifname}");
    let dev = within(ns, || via_user::open_device(&name)).unwrap_or_else(|e| panic!("opening {name}: {e}"));
    let config = Config { progress_thread: false, ..Config::default() };
    Nic::with_device(&name, dev, config).unwrap_or_else(|e| panic!("starting the engine on {name}: {e}"))
}

fn attrs(nic: &Nic) -> ViAttributes {
    let ptag = nic.create_ptag().expect("creating a protection tag");
    ViAttributes { reliability: Reliability::ReliableDelivery, max_transfer_size: 1 << 16, ptag, enable_rdma_write: false, enable_rdma_read: false }
}

/// Host a decides the peer connection (its identity is the lower). b knows
/// a's Ethernet address (a static neighbour entry) but answers no ARP
/// request, so a cannot resolve b: a's accept of b's request stays in a's
/// engine. Once a has processed b's request, b starts answering ARP, and
/// a's thread, after its wait returns, never enters the engine again. b
/// must connect all the same: a's wait returns only once the accept left.
#[test]
fn a_peer_accept_leaves_before_the_deciding_side_reports_connected() {
    let net = TestNet::udp(1500);
    let (ip_a, ip_b) = (net.ip_a().parse().unwrap(), net.ip_b().parse().unwrap());
    let (id_a, id_b) = (MacAddr::for_ipv4(ip_a), MacAddr::for_ipv4(ip_b));
    assert!(id_a.0 < id_b.0, "a must be the deciding side");
    let mac_a = net.mac_of(&net.a, &net.va);
    ip(&["-n", &net.b, "neigh", "replace", net.ip_a(), "lladdr", &mac_a, "dev", &net.vb, "nud", "permanent"]);
    sysctl(&net, &net.b, &format!("net.ipv4.conf.{}.arp_ignore=8", net.vb));

    let (nic_a, nic_b) = (open(&net.a, &net.va), open(&net.b, &net.vb));
    let (mut vi_a, mut vi_b) = (nic_a.create_vi(&attrs(&nic_a), None, None).unwrap(), nic_b.create_vi(&attrs(&nic_b), None, None).unwrap());
    let timeout = Some(Duration::from_secs(20));

    let b = std::thread::spawn(move || {
        vi_b.connect_peer_request(id_a, b"b", b"a", timeout)?;
        vi_b.connect_peer_wait().map(|()| vi_b)
    });
    let (connected_tx, connected_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let a = std::thread::spawn(move || {
        vi_a.connect_peer_request(id_b, b"a", b"b", timeout).expect("a's request");
        let r = vi_a.connect_peer_wait();
        connected_tx.send(r.map_err(|e| e.to_string())).unwrap();
        // Blocked elsewhere: the engine is never entered again here.
        let _ = end_rx.recv();
        vi_a
    });

    // Once a has processed b's request (its accept was tried and found no
    // next hop), b starts answering ARP.
    let deadline = Instant::now() + Duration::from_secs(10);
    while nic_a.counters().rx_frames == 0 {
        assert!(Instant::now() < deadline, "b's peer request never reached a: {:?}", nic_a.counters());
        std::thread::yield_now();
    }
    assert_eq!(nic_a.device_counters().iter().find(|(n, _)| *n == "tx_frames").map(|p| p.1), Some(0), "a sent a frame to b before b answered ARP");
    sysctl(&net, &net.b, &format!("net.ipv4.conf.{}.arp_ignore=0", net.vb));

    let a_result = connected_rx.recv().expect("a's thread ended without a word");
    assert_eq!(a_result, Ok(()), "a's peer wait");
    let b_result = b.join().expect("b's thread panicked");
    assert!(b_result.is_ok(), "b never connected (a's accept stranded in a's engine): {:?}", b_result.err());
    end_tx.send(()).unwrap();
    let _vi_a = a.join().expect("a's thread panicked");
}
