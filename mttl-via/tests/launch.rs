//! MTTL end to end: `mttl-run` starts `mttl-check` as 1, 2, 4 and 8 real
//! processes, each in its own network namespace, over VIA (the software
//! NIC on veth) and over TCP. Needs root (namespaces).
//!
//! The runs go one after another (one test per transport) so that the
//! leftover checks can see every process and namespace the run made.

use std::process::{Command, Stdio};

const RUN: &str = env!("CARGO_BIN_EXE_mttl-run");
const CHECK: &str = env!("CARGO_BIN_EXE_mttl-check");

/// Runs `mttl-check ARGS` on `n` ranks; returns (success, output, the
/// pid of mttl-run).
/// Runs `mttl-check args` on `n` ranks over `path`: `via` (mttl-run's
/// default: the composite device, shared memory between the ranks),
/// `via-nic` (the software NIC alone) or `tcp`.
fn mttl_run_pid(n: usize, path: &str, args: &[&str]) -> (bool, String, u32) {
    mttl_run_env(n, path, args, &[])
}

/// [`mttl_run_pid`] with `env` set for the ranks.
fn mttl_run_env(n: usize, path: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, u32) {
    let (transport, nic_only): (&str, &[&str]) = match path {
        "via-nic" => ("via", &["--nic-only"]),
        t => (t, &[]),
    };
    let child = Command::new(RUN)
        .args(["-n", &n.to_string(), "--transport", transport])
        .args(nic_only)
        .args(["--timeout", "240", "--", CHECK])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting mttl-run");
    let pid = child.id();
    let out = child.wait_with_output().expect("waiting for mttl-run");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text, pid)
}

fn mttl_run(n: usize, transport: &str, args: &[&str]) -> (bool, String) {
    let (ok, out, _) = mttl_run_pid(n, transport, args);
    (ok, out)
}

/// The pids the ranks reported.
fn rank_pids(out: &str) -> Vec<i32> {
    out.lines().filter_map(|l| l.split_once("mttl-check: rank ")?.1.split_once(" pid ")?.1.trim().parse().ok()).collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn our_namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("mttl")).map(String::from).collect()
}

/// Each rank's frames received through the NIC and through shared memory,
/// as `mttl-check` reports them at the end.
fn frames_by_path(out: &str) -> Vec<(u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.split_once("received frames: nic ")?.1;
            let (nic, shm) = rest.split_once(" shm ")?;
            let shm = shm.split(';').next()?;
            Some((nic.trim().parse().ok()?, shm.trim().parse().ok()?))
        })
        .collect()
}

/// Each rank's connections and peak resident memory (KiB), as
/// `mttl-check` reports them at the end, by rank.
fn connections_and_memory(out: &str) -> Vec<(usize, Option<usize>, u64)> {
    let mut v: Vec<_> = out
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("mttl-check: rank ")?.1;
            let (rank, rest) = rest.split_once(' ')?;
            let conns = rest.split_once("connections ")?.1.split(';').next()?.trim();
            let kib = rest.split_once("peak resident memory ")?.1.split(' ').next()?;
            Some((rank.parse().ok()?, conns.parse().ok(), kib.parse().ok()?))
        })
        .collect();
    v.sort();
    v
}

/// 64 ranks on one host, each talking to its neighbour (and rank 0 to
/// every rank): with connections on demand (the default) a rank holds
/// connections only to the ranks it talked to; with every pair connected
/// at start-up (`MTTL_VIA_CONNECT=all`) each holds 63. Each rank's peak
/// memory is printed beside the other's.
#[test]
fn sixty_four_ranks_connect_on_demand() {
    let (ok, demand, _) = mttl_run_env(64, "via", &["ring"], &[]);
    assert!(ok && demand.contains("passed (64 ranks)"), "{demand}");
    let (ok, all, _) = mttl_run_env(64, "via", &["ring"], &[("MTTL_VIA_CONNECT", "all")]);
    assert!(ok && all.contains("passed (64 ranks)"), "{all}");
    let (d, a) = (connections_and_memory(&demand), connections_and_memory(&all));
    assert_eq!((d.len(), a.len()), (64, 64), "every rank reports\n{demand}\n{all}");
    for (&(rank, conns, kib), &(_, all_conns, all_kib)) in d.iter().zip(&a) {
        println!("rank {rank}: on demand {} connections, peak {kib} KiB; all connected {} connections, peak {all_kib} KiB", conns.unwrap_or(0), all_conns.unwrap_or(0));
        assert_eq!(all_conns, Some(63), "rank {rank}, all connected");
        if rank == 0 {
            assert_eq!(conns, Some(63), "rank 0 starts every rank");
        } else {
            assert!(conns.is_some_and(|c| (1..=3).contains(&c)), "rank {rank} holds {conns:?} connections: rank 0 and its neighbours at most");
        }
    }
    let median = |v: &[(usize, Option<usize>, u64)]| {
        let mut k: Vec<u64> = v.iter().map(|x| x.2).collect();
        k.sort_unstable();
        k[k.len() / 2]
    };
    println!("median peak memory per rank: on demand {} KiB, all connected {} KiB", median(&d), median(&a));
}

fn everything_at(transport: &str) {
    for n in [1, 2, 4, 8] {
        let (ok, out) = mttl_run(n, transport, &["all"]);
        assert!(ok, "{transport} at {n} ranks failed:\n{out}");
        // The path the frames took: the ranks share this host, so by
        // default they talk through shared memory, and never with
        // --nic-only.
        let frames = frames_by_path(&out);
        assert_eq!(frames.len(), n, "every rank reports its frames:\n{out}");
        if n > 1 {
            match transport {
                "via" => assert!(frames.iter().all(|&(nic, shm)| nic == 0 && shm > 0), "{frames:?}"),
                "via-nic" => assert!(frames.iter().all(|&(nic, shm)| nic > 0 && shm == 0), "{frames:?}"),
                _ => {}
            }
        }
        for what in ["invoke ok", "sync ok", "gptr ok", "coll ok", "many ok", &format!("passed ({n} ranks)")] {
            assert!(out.contains(what), "{transport} at {n} ranks: no {what:?} in\n{out}");
        }
        assert!(out.lines().all(|l| l.starts_with('[') && l[1..].split_once(']').is_some_and(|(r, _)| r.parse::<usize>().is_ok_and(|r| r < n))), "every line carries its rank:\n{out}");
        let (ok, out) = mttl_run(n, transport, &["comm"]);
        assert!(ok, "{transport} primitives at {n} ranks failed:\n{out}");
        assert_eq!(out.matches("comm ok").count(), n, "{out}");
    }
    // One rank stops: the whole run stops, says why, and leaves nothing.
    let (ok, out, run_pid) = mttl_run_pid(4, transport, &["crash"]);
    assert!(!ok, "a run with a crashed rank must fail:\n{out}");
    assert!(out.contains("rank 3 stops on purpose"), "{out}");
    assert!(out.contains("rank 3 exited with status 3"), "mttl-run names the failed rank:\n{out}");
    // Survivors that noticed before mttl-run stopped them say which peer
    // went away (rank 3, or a rank that stopped because of it); nothing
    // failed for another reason.
    for l in out.lines().filter(|l| l.contains("] mttl: rank ")) {
        assert!(l.contains("; did rank ") && l.ends_with(" stop?"), "a rank failed for another reason: {l}\n{out}");
    }
    let pids = rank_pids(&out);
    assert_eq!(pids.len(), 4, "{out}");
    assert!(pids.iter().all(|&p| !alive(p)), "no rank process is left: {pids:?}");
    let ours = format!("mttl{run_pid}-");
    assert!(our_namespaces().iter().all(|ns| !ns.starts_with(&ours)), "namespaces left: {:?}", our_namespaces());
}

#[test]
fn mttl_over_via_at_1_2_4_8_ranks() {
    everything_at("via");
}

#[test]
fn mttl_over_via_on_the_software_nic_alone_at_1_2_4_8_ranks() {
    everything_at("via-nic");
}

#[test]
fn mttl_over_tcp_at_1_2_4_8_ranks() {
    everything_at("tcp");
}

/// A cluster of SMP hosts (`--hosts 2`: ranks 0-1 on one, 2-3 on the
/// other): each rank reaches its neighbour through shared memory and the
/// other host through the NIC, from one VIA device and one CQ, and every
/// check passes.
#[test]
fn composite_devices_route_by_host() {
    let child = Command::new(RUN).args(["-n", "4", "--hosts", "2", "--timeout", "240", "--", CHECK, "all"]).output().expect("mttl-run");
    let out = format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    assert!(child.status.success() && out.contains("passed (4 ranks)"), "{out}");
    let frames = frames_by_path(&out);
    assert_eq!(frames.len(), 4, "{out}");
    assert!(frames.iter().all(|&(nic, shm)| nic > 0 && shm > 0), "both paths carry frames on every rank: {frames:?}");
}

/// Remote atomics over links that lose and duplicate 1 % of frames each
/// way (`--faults`): four rank processes add to one word and take a
/// compare-and-swap lock (mttl-check's atomic check, which fails on a
/// value seen twice, a wrong total or a lost increment), and the faults
/// did happen on the way.
#[test]
fn atomics_are_exact_over_lossy_duplicating_links() {
    let child = Command::new(RUN)
        .args(["-n", "4", "--nic-only", "--faults", "loss=0.01,dup=0.01", "--timeout", "240", "--", CHECK, "atomic"])
        .output()
        .expect("mttl-run");
    let out = format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    assert!(child.status.success() && out.contains("atomic ok") && out.contains("passed (4 ranks)"), "{out}");
    let faults: Vec<(u64, u64)> = out
        .lines()
        .filter_map(|l| {
            let f = l.split_once(" faults: lost ")?.1;
            let (lost, rest) = f.split_once(" duplicated ")?;
            Some((lost.parse().ok()?, rest.split_whitespace().next()?.parse().ok()?))
        })
        .collect();
    assert_eq!(faults.len(), 4, "every rank reports its faults: {out}");
    let (lost, dup) = faults.iter().fold((0, 0), |(l, d), &(a, b)| (l + a, d + b));
    assert!(lost > 0 && dup > 0, "the links lost {lost} and duplicated {dup} frames: nothing was tested");
}

/// One receive pool per rank, far smaller than the peers' windows in all
/// (`MTTL_VIA_POOL=4` against 3 peers x 32): messages that find it empty
/// are refused receiver-not-ready and sent again, and every check passes
/// (a lost message fails its check, a broken VI the run); a rank waiting
/// for one node's messages while the others' fill the pool copies those
/// out.
#[test]
fn a_receive_pool_smaller_than_the_windows_loses_nothing() {
    let (ok, out, _) = mttl_run_env(4, "via", &["all"], &[("MTTL_VIA_POOL", "4"), ("MTTL_VIA_COUNTERS", "1")]);
    assert!(ok && out.contains("passed (4 ranks)"), "{out}");
    let refused: u64 = out.lines().filter_map(|l| l.split_once("rnr_refused ")?.1.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()).sum();
    assert!(refused > 0, "the pool never ran dry: nothing was tested\n{out}");
    // The layer's own test: each rank takes one node's messages at a time
    // (brecnode) while the others' fill the pool. Those are copied out of
    // it so that the awaited ones find receives; all come in order.
    let (ok, out, _) = mttl_run_env(4, "via", &["comm"], &[("MTTL_VIA_POOL", "8"), ("MTTL_VIA_COUNTERS", "1")]);
    assert!(ok && out.matches("comm ok").count() == 4, "{out}");
    let spilled: u64 = out.lines().filter_map(|l| l.split_once("spilled from the receive pool: ")?.1.trim().parse::<u64>().ok()).sum();
    assert!(spilled > 0, "no frame was copied out of the pool: nothing was tested\n{out}");
}

/// Ranks started without mttl-run, as Slurm or mpirun would (rank and
/// size from the launcher's variables, the rendezvous at rank 0), over
/// TCP on this host: the same program runs; two different programs are
/// refused at start-up, with both ranks saying why.
#[test]
fn ranks_from_a_cluster_launcher_and_different_programs_refused() {
    let bench = env!("CARGO_BIN_EXE_mttl-bench");
    let start = |rank: usize, prog: &str, port: u16, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .env("SLURM_PROCID", rank.to_string())
            .env("SLURM_NTASKS", "2")
            .env("MTTL_ROOT", format!("127.0.0.1:{port}"))
            .env("MTTL_TRANSPORT", "tcp")
            .env("RUST_BACKTRACE", "0")
            .env_remove("MTTL_RANK")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a rank")
    };
    // A free port for the rendezvous.
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let p = port();
    let ranks = [start(0, CHECK, p, &["invoke"]), start(1, CHECK, p, &["invoke"])];
    let outs: Vec<_> = ranks.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let text = |o: &std::process::Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(outs.iter().all(|o| o.status.success()), "{}\n{}", text(&outs[0]), text(&outs[1]));
    assert!(text(&outs[0]).contains("passed (2 ranks)"), "{}", text(&outs[0]));

    let p = port();
    let ranks = [start(0, CHECK, p, &["invoke"]), start(1, bench, p, &["--worker", "nread"])];
    let outs: Vec<_> = ranks.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for o in &outs {
        assert!(!o.status.success(), "a mixed run must fail:\n{}", text(o));
        assert!(text(o).contains("runs a different program than rank 0"), "{}", text(o));
    }
}

/// The spin of blocking waits that mttl-run hands its ranks: with more
/// ranks than CPUs they sleep at once (`VIA_SPIN_US=0`, read by both
/// layers), since a spinning rank holds a CPU that a rank with work needs;
/// with no more ranks than CPUs the default spin stays; a spin the caller
/// set is kept either way.
#[test]
fn waits_sleep_at_once_when_ranks_outnumber_cpus() {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let spins = |n: usize, caller: Option<&str>| -> Vec<String> {
        let mut cmd = Command::new(RUN);
        cmd.args(["-n", &n.to_string(), "--timeout", "60", "--", "sh", "-c", "echo spin=${VIA_SPIN_US-default}"]).env_remove("VIA_SPIN_US").env_remove("MTTL_TCP_SPIN_US");
        if let Some(us) = caller {
            cmd.env("VIA_SPIN_US", us);
        }
        let out = cmd.output().expect("mttl-run");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{text}");
        let spins: Vec<String> = text.lines().filter_map(|l| l.split_once("spin=")).map(|(_, s)| s.to_string()).collect();
        assert_eq!(spins.len(), n, "every rank answers:\n{text}");
        spins
    };
    assert!(spins(cpus + 1, None).iter().all(|s| s == "0"), "oversubscribed: sleep at once");
    assert!(spins(cpus, None).iter().all(|s| s == "default"), "one rank per CPU: the default spin");
    assert!(spins(cpus + 1, Some("50")).iter().all(|s| s == "50"), "the caller's spin is kept");
}
