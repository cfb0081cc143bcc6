//! via-pingpong: VIA latency and bandwidth between two hosts, beside the
//! baselines of the same path (raw AF_PACKET frames, UDP, TCP).
//!
//! Modules: `common` (options, rows, statistics, the protocol over a
//! message link), `via` (the VIA transport), `raw` and `sock` (baselines),
//! `probe` (the C reference ping-pong), `demo` (two namespaces on one
//! machine), `plot` (SVG curves).

mod cleanup;
mod common;
mod demo;
mod floor;
mod mpi;
mod ofi;
mod plot;
mod probe;
mod raw;
mod sock;
mod tool;
mod ucx;
mod via;

use common::{json_array, print_tables, sweep, LinkClient, Options, Row};
use std::io::{self, Write};
use via_kernel_agent::names::NameService;

// The device drivers, linked so that each registers itself in via-device's
// opener table (nothing here names them otherwise).
use via_nic_e1000e as _;
use via_nic_tulip as _;
use via_softnic as _;
use via_wire::MacAddr;

const HELP: &str = "\
via-pingpong: VIA ping-pong latency and bandwidth, with baselines on the same path

USAGE:
    via-pingpong --demo [--quick] [--json] [--plot DIR] [--mtu N] [--transports LIST]
    via-pingpong server [--transport T] [--device DEV] [--bind-ip IP] [--port N] [options]
    via-pingpong client --peer ADDR [--transport T] [--device DEV] [--port N] [options]

    --demo            as root: create two network namespaces joined by a veth pair, run
                      server and client of every transport, print the tables, the ratios
                      VIA/raw, VIA/udp, VIA/tcp, tcp and udp against the C probe,
                      auth/plain and peak memory, remove everything again.
                      Without root: VIA over the in-process loopback (/dev/via_lo) only.
    --transport T     via (default), raw (AF_PACKET frames, the floor), udp, tcp
    --transports L    the demo's transports, comma-separated (default
                      raw,via,via-auth,via-shm,via-udp,via-unrel,via-write,via-read,udp,tcp,
                      and c-tcp,c-udp, the C probe, beside tcp and udp; via-auth is
                      VIA with a cluster secret on both ends (every frame carries a
                      MAC); via-udp is VIA in UDP/IPv4 datagrams (device udp:<ifname>,
                      the routable encapsulation) on the same link; via-shm is VIA
                      through composite devices joined by shared memory;
                      with via-shm, the rounds also time shm-floor, two processes
                      handing a cache line back and forth (the floor via-shm is held to),
                      and, where installed, ompi-shm, ucx-shm and ofi-shm, Open MPI's,
                      UCX's and libfabric's shared memory (probe/mpi_shm.c with mpicc;
                      ucx_perftest; fi_pingpong -p shm, 64 B latency only), pinned alike;
                      via-shm-lent, not in the default, the same with payloads of
                      16 KiB and more lent: copied once, from the sender's memory;
                      via?<faults>, e.g. via?loss=0.05, VIA over devices that lose,
                      duplicate, reorder or corrupt frames (loss=P,dup=P,reorder=P,
                      corrupt=P), for goodput against the clean link)
    --rdma MODE       with --transport via: write (RDMA write latency, perftest
                      ib_write_lat style: one-way, memory polled) or read (RDMA
                      read; latency is the whole read, a round trip) and their
                      bandwidths (a 0-byte RDMA write latency writes the 1-byte tag);
                      atomic (a remote fetch-and-add of one 8-byte word, the
                      vipl_ext.h extension, timed as a read: latency only; demo
                      transport via-atomic, printed against via-read)
    --device DEV      VIA device name: /dev/via_<ifname> (default /dev/via_lo), or
                      udp:<ifname> for VIA in UDP/IPv4 datagrams (hosts named by IPv4 address)
    --peer ADDR       client: server MAC, IPv4 address (udp: devices) or host name (via, raw;
                      names from $VIA_HOSTS) or IP (udp, tcp)
    --bind-ip IP      server address for udp/tcp (default 0.0.0.0); --port N (default 18515)
    --reliability R   reliable (default; VIA reliable delivery) or unreliable (latency only)
    --sizes LIST      latency sizes in bytes (default 0,1,2,4,...,1048576)
    --bw-sizes LIST   bandwidth sizes (default 1,2,4,...,1048576)
    --max-size N      both sweeps stop at N bytes
    --quick           fewer iterations
    --iters N         N latency iterations and N bandwidth messages at every size
    --bw-iters N      N bandwidth messages at every size (overrides --iters for them)
    --verify          VIA client: after the sweep, check the contents of messages both ways
                      at every latency size (send/receive, or the --rdma mode); any
                      mismatch fails the run
    --recv-cq         VIA, both ends: receives complete through a completion queue
                      (CQWait, then RecvDone), as a CQ-driven program takes them
    --stats           VIA client: at the end, print the engine's counters (frames,
                      retransmissions, drops by reason) and the device's, to stderr
    --json            print one JSON array of rows {transport, op, bytes, iters, t_min_us,
                      t_typical_us, t_avg_us, t_p99_us, t_p999_us, mb_per_s, mpps}; latency
                      rows carry mb_per_s = bytes / t_typical, bandwidth rows t_* = 0
    --plot DIR        write DIR/latency.svg and DIR/bandwidth.svg
    --cpu N           run on CPU N only (the demo pins the server to CPU 0 and the client
                      to CPU 1 when there are two or more, for every transport alike)
    --mtu N           demo: veth MTU (default 1500); udp: datagrams fit this MTU
    --kernel-loss N   demo: the hosts meet through a switch (a bridge in a third namespace) whose
                      kernel drops N frames in a thousand, of every kind (VIA's, TCP's, UDP's
                      alike), arriving on either port (an nftables netdev ingress rule,
                      `numgen random mod 1000 < N drop`; needs nft): goodput under the same loss
                      (the C probe, a check of the baselines on a clean link, is left out)
    --no-port-rule    demo: leave out the rule that keeps each host's IP stack off VIA's UDP
                      port (via-agent udp-port; with via-udp, installed by default where nft is)
    --rounds N        demo: after the sweeps, N alternating rounds of every transport at 64 B
                      latency and 1 MiB bandwidth; the ratios use their medians (default 5)
    --discriminator S VIA connection discriminator (default pingpong)

Latency is one-way (round trip / 2) in microseconds; t_typical is the median.
Environment: VIA_SPIN_US (spin before sleeping, all transports), VIA_HOSTS.";

fn parse() -> Result<(String, Options), String> {
    let mut o = Options::default();
    let mut mode = String::new();
    let mut args = std::env::args().skip(1);
    let list = |v: &str| -> Result<Vec<usize>, String> { v.split(',').filter(|s| !s.is_empty()).map(|s| s.trim().parse().map_err(|_| format!("bad size {s:?}"))).collect() };
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "-h" | "--help" => mode = "help".into(),
            "--demo" => mode = "demo".into(),
            "server" | "client" => mode = a.clone(),
            "--transport" => o.transport = val()?,
            "--transports" => o.transports = val()?.split(',').map(String::from).collect(),
            "--device" => o.device = val()?,
            "--peer" => o.peer = val()?,
            "--bind-ip" => o.bind_ip = val()?,
            "--port" => o.port = val()?.parse().map_err(|_| "bad port")?,
            "--reliability" => {
                o.reliability = match val()?.as_str() {
                    "reliable" | "rel" => via_user::Reliability::ReliableDelivery,
                    "unreliable" | "unrel" => via_user::Reliability::Unreliable,
                    v => return Err(format!("unknown reliability {v:?}")),
                }
            }
            "--sizes" => o.sizes = list(&val()?)?,
            "--bw-sizes" => o.bw_sizes = list(&val()?)?,
            "--max-size" => {
                let m: usize = val()?.parse().map_err(|_| "bad --max-size")?;
                o.sizes.retain(|s| *s <= m);
                o.bw_sizes.retain(|s| *s <= m);
            }
            "--quick" => o.quick = true,
            "--verify" => o.verify = true,
            "--stats" => o.stats = true,
            "--recv-cq" => o.recv_cq = true,
            "--iters" => o.iters = Some(val()?.parse().map_err(|_| "bad --iters")?),
            "--bw-iters" => o.bw_iters = Some(val()?.parse().map_err(|_| "bad --bw-iters")?),
            "--json" => o.json = true,
            "--plot" => o.plot = Some(val()?),
            "--cpu" => o.cpu = Some(val()?.parse().map_err(|_| "bad --cpu")?),
            "--rounds" => o.rounds = val()?.parse().map_err(|_| "bad --rounds")?,
            "--mtu" => o.mtu = val()?.parse().map_err(|_| "bad --mtu")?,
            "--no-port-rule" => o.port_rule = false,
            "--kernel-loss" => o.kernel_loss = val()?.parse().ok().filter(|n| *n < 1000).ok_or("bad --kernel-loss (want frames per thousand, 0-999)")?,
            "--discriminator" => o.discriminator = val()?,
            "--rdma" => {
                let m = val()?;
                if m != "write" && m != "read" && m != "atomic" {
                    return Err(format!("--rdma is write, read or atomic, not {m:?}"));
                }
                o.rdma = Some(m);
            }
            _ => return Err(format!("unknown argument {a:?} (see --help)")),
        }
    }
    if !["via", "raw", "udp", "tcp"].contains(&o.transport.as_str()) {
        return Err(format!("unknown transport {:?}", o.transport));
    }
    if let Some(t) = o.transports.iter().find(|t| !common::DEMO_TRANSPORTS.contains(&t.as_str())) {
        let beside = if ["shm-floor", "ompi-shm", "ucx-shm", "ofi-shm"].contains(&t.as_str()) { " (the shared-memory references run beside via-shm by themselves: name via-shm)" } else { "" };
        return Err(format!("unknown demo transport {t:?}{beside}; --transports takes {}", common::DEMO_TRANSPORTS.join(",")));
    }
    Ok((mode, o))
}

/// Restricts this process to CPU `cpu` (threads started later inherit it).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("via-pingpong: cannot pin to CPU {cpu}: {}", io::Error::last_os_error());
        }
    }
}

fn ready(addr: &str) {
    println!("READY {addr}");
    let _ = io::stdout().flush();
}

fn server(o: &Options) -> io::Result<()> {
    let max = common::max_size(o);
    match o.transport.as_str() {
        "via" => via::server(o, |mac| ready(&mac)),
        "raw" => {
            let mut l = raw::RawLink::open(&o.device, None)?;
            ready(&l.mac().to_string());
            common::serve_link(&mut l, max)
        }
        "udp" => {
            let mut l = sock::UdpLink::server(&o.bind_ip, o.port, o.mtu)?;
            ready(&o.bind_ip);
            common::serve_link(&mut l, max)
        }
        _ => {
            let mut l = sock::TcpLink::server(&o.bind_ip, o.port, || ready(&o.bind_ip))?;
            common::serve_link(&mut l, max)
        }
    }
}

fn peer_mac(o: &Options) -> io::Result<MacAddr> {
    let ns = NameService::load_default()?;
    ns.lookup(&o.peer).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("peer {:?} is neither a MAC nor a name in {}", o.peer, NameService::default_path().display())))
}

fn client(o: &Options) -> io::Result<Vec<Row>> {
    let max = common::max_size(o);
    let run = |l: &mut dyn common::Link, name: &str| -> io::Result<Vec<Row>> {
        let mut c = LinkClient::new(l, max);
        let rows = sweep(o, name, &mut c, true)?;
        c.finish()?;
        Ok(rows)
    };
    match o.transport.as_str() {
        "via" => via::client(o),
        "raw" => run(&mut raw::RawLink::open(&o.device, Some(peer_mac(o)?))?, "raw"),
        "udp" => run(&mut sock::UdpLink::client(&o.peer, o.port, o.mtu)?, "udp"),
        _ => run(&mut sock::TcpLink::client(&o.peer, o.port)?, "tcp"),
    }
}

/// `via-pingpong shm-floor serve|time PATH N [--cpu C]`: one side of the
/// demo's shared-memory floor probe (see `floor.rs`).
fn floor_side(args: &[String]) -> i32 {
    let [role, path, n, rest @ ..] = args else {
        eprintln!("via-pingpong shm-floor: want serve|time PATH N [--cpu C]");
        return 2;
    };
    if let ["--cpu", c] = rest.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        match c.parse() {
            Ok(c) => pin_to(c),
            Err(_) => return 2,
        }
    }
    match floor::side(role, path, n.parse().unwrap_or(0)) {
        Ok(Some(row)) => {
            println!("{}", json_array(&[row]));
            0
        }
        Ok(None) => 0,
        Err(e) => {
            eprintln!("via-pingpong shm-floor {role}: {e}");
            1
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("shm-floor") {
        std::process::exit(floor_side(&args[2..]));
    }
    let (mode, o) = match parse() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("via-pingpong: {e}");
            std::process::exit(2);
        }
    };
    if let Some(cpu) = o.cpu {
        pin_to(cpu);
    }
    let code = match mode.as_str() {
        "demo" => demo::run(&o),
        "server" => match server(&o) {
            Ok(()) => {
                // Where each reply's time went (built with the probe
                // feature: scripts/turnaround.sh); nothing otherwise.
                via_device::probe::report(&format!("server {}", o.transport));
                0
            }
            Err(e) => {
                eprintln!("via-pingpong server: {e}");
                1
            }
        },
        "client" => match client(&o) {
            Ok(rows) => {
                // The client's turnaround too (pong seen to next ping
                // sent), with the probe feature; nothing otherwise.
                via_device::probe::report(&format!("client {}", o.transport));
                if o.json {
                    println!("{}", json_array(&rows));
                } else {
                    print_tables(&rows.first().map_or(String::new(), |r| r.transport.clone()), &rows);
                }
                if let Some(dir) = &o.plot {
                    if let Err(e) = plot::write(std::path::Path::new(dir), &rows) {
                        eprintln!("via-pingpong: plots: {e}");
                    }
                }
                0
            }
            Err(e) => {
                eprintln!("via-pingpong client: {e}");
                1
            }
        },
        _ => {
            println!("{HELP}");
            i32::from(mode != "help")
        }
    };
    eprintln!("peak_rss_kib={}", common::peak_rss_kib());
    std::process::exit(code);
}
