//! `cg-bench [--classes A,B] [--ranks 1,2,4] [--rounds R] [--device nic|composite] [--mtu BYTES]`:
//! the CG table of docs/BENCHMARKS.md, VIA layer against TCP layer in the
//! same run. Each round runs every (class, ranks) cell once over each
//! layer with `mttl-run` (both found next to this program), the layer that
//! goes first alternating from round to round; every run must verify.
//!
//! Per cell it prints the median time and Mop/s of each layer, the median
//! and quartiles of the per-round VIA/TCP time ratios, in how many rounds
//! VIA was faster with the two-sided sign-test probability of a split at
//! least that uneven if neither layer were faster, and the communication
//! inside CG (`CG_TIMERS`: product exchange plus dot sums, the smaller of
//! the ranks' sums, i.e. the rank that waited least for the other). On a
//! noisy machine the run time of a cell varies by more than its whole
//! communication; the sign test and the communication column say what the
//! rounds can and cannot tell apart.
//!
//! `--device nic` (default) runs the VIA layer on the software NIC alone
//! (`mttl-run --nic-only`); `composite` lets ranks on one host use shared
//! memory (mttl-run's default).
//!
//! `--against-npb DIR` compares with what a user would run instead: NPB's
//! own MPI CG (`DIR/bin/cg.<class>.x`, built by the user: NPB is not ours
//! to ship; without it the program says how to build it) under Open MPI's
//! `mpirun -n N --bind-to core`, alternating with `cg` on MTTL's VIA layer
//! (mttl-run pins rank i to CPU i alike). On `--device nic` Open MPI uses
//! its TCP transport (`--mca btl self,tcp`), on `composite` its shared
//! memory (vader), so each side takes the same kind of path. The table
//! then gives ours/NPB per round, and the interquartile range of each
//! side's times (the spread).

use std::path::Path;
use std::process::Command;

struct Opts {
    classes: Vec<String>,
    ranks: Vec<usize>,
    rounds: usize,
    nic_only: bool,
    mtu: Option<String>,
    /// NPB-MPI's folder (holding bin/cg.<class>.x): compare with it instead of the TCP layer.
    npb: Option<std::path::PathBuf>,
}

const USAGE: &str = "usage: cg-bench [--classes A,B] [--ranks 1,2,4] [--rounds R] [--device nic|composite] [--mtu BYTES] [--against-npb DIR]
  --classes     NPB classes (default A,B)
  --ranks       rank counts (default 1,2,4)
  --rounds R    rounds (default 3); each runs every cell over both layers, the first layer alternating
  --device      nic: the VIA layer on the software NIC alone (default); composite: shared memory between ranks
  --mtu BYTES   the links' MTU (mttl-run's default otherwise)
  --against-npb DIR  compare with NPB-MPI CG (DIR/bin/cg.<class>.x under Open MPI's mpirun) instead of the TCP layer
Environment: VIA_SPIN_US (spin of blocking waits, both layers; mttl-run sets 0 when ranks outnumber CPUs).
Every run (one line per run on stderr) must verify; one that does not stops the benchmark (exit status 1).";

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts { classes: vec!["A".into(), "B".into()], ranks: vec![1, 2, 4], rounds: 3, nic_only: true, mtu: None, npb: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            "--classes" => o.classes = value().split(',').map(|c| c.trim().to_uppercase()).collect(),
            "--ranks" => o.ranks = value().split(',').map(|n| n.trim().parse().unwrap_or_else(|_| usage())).collect(),
            "--rounds" => o.rounds = value().parse().ok().filter(|&r| r > 0).unwrap_or_else(|| usage()),
            "--device" => {
                o.nic_only = match value().as_str() {
                    "nic" => true,
                    "composite" => false,
                    _ => usage(),
                }
            }
            "--mtu" => o.mtu = Some(value()),
            "--against-npb" => o.npb = Some(value().into()),
            _ => usage(),
        }
    }
    if o.classes.iter().any(|c| nas_cg::npb::Class::by_name(c).is_none()) || o.ranks.is_empty() {
        usage();
    }
    o
}

/// One verified run: its time (from Mop/s, which NPB prints with more
/// digits), Mop/s and the communication seconds inside CG.
#[derive(Clone, Copy, Debug)]
struct Run {
    seconds: f64,
    mops: f64,
    comm: f64,
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let at = text.find(key)? + key.len();
    text[at..].trim_start_matches([' ', '=']).split_whitespace().next()?.parse().ok()
}

/// The smaller of the ranks' "product exchange + dot sums" (`CG_TIMERS`).
fn comm_seconds(stderr: &str) -> Option<f64> {
    stderr
        .lines()
        .filter(|l| l.contains("cg timers"))
        .map(|l| Some(number_after(l, "product exchange")? + number_after(l, "dot sums")?))
        .collect::<Option<Vec<f64>>>()?
        .into_iter()
        .reduce(f64::min)
}

/// What runs in a cell: `cg` on MTTL over one of its layers, or NPB's
/// own MPI CG under Open MPI.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    Via,
    Tcp,
    Npb,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Via => "via",
            Side::Tcp => "tcp",
            Side::Npb => "npb",
        }
    }
}

/// NPB's binary for `class` in the folder the user named (its `bin/`, or
/// the folder itself).
fn npb_binary(dir: &Path, class: &str) -> Option<std::path::PathBuf> {
    let name = format!("cg.{class}.x");
    [dir.join("bin").join(&name), dir.join(&name)].into_iter().find(|p| p.is_file())
}

const NPB_HOWTO: &str = "NPB is not shipped with via-rs; build its MPI CG beside the project (docs/BENCHMARKS.md, \"NPB-MPI CG\"):
  apt-get install -y gfortran libopenmpi-dev openmpi-bin
  get NPB 3.4 (NPB3.4-MPI, https://www.nas.nasa.gov/software/npb.html), then in NPB3.4-MPI:
  cp config/make.def.template config/make.def   # if absent; MPIFC = mpif90, FFLAGS = -O3
  mkdir -p bin && make cg CLASS=A && make cg CLASS=B
and pass that NPB3.4-MPI folder to --against-npb.";

fn command(dir: &Path, o: &Opts, class: &str, n: usize, side: Side) -> Command {
    if side == Side::Npb {
        let npb = o.npb.as_deref().expect("an NPB folder with Side::Npb");
        let bin = npb_binary(npb, class).unwrap_or_else(|| {
            eprintln!("cg-bench: no cg.{class}.x in {} or its bin/\n{NPB_HOWTO}", npb.display());
            std::process::exit(1)
        });
        let mut cmd = Command::new("mpirun");
        // One rank per CPU, bound as mttl-run pins; more ranks than CPUs
        // float, as mttl-run's do.
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        cmd.args(["-n", &n.to_string()]);
        if n <= cpus {
            cmd.args(["--bind-to", "core"]);
        } else {
            cmd.args(["--oversubscribe", "--bind-to", "none"]);
        }
        if o.nic_only {
            cmd.args(["--mca", "btl", "self,tcp"]); // the NIC path, as --nic-only is ours
        }
        cmd.arg(bin).env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        return cmd;
    }
    let mut cmd = Command::new(dir.join("mttl-run"));
    cmd.args(["-n", &n.to_string(), "--transport", side.name(), "--timeout", "1800"]);
    if o.nic_only {
        cmd.arg("--nic-only");
    }
    if let Some(m) = &o.mtu {
        cmd.args(["--mtu", m]);
    }
    cmd.arg("--").arg(dir.join("cg")).args(["--class", class]).env("CG_TIMERS", "1");
    cmd
}

fn run_once(dir: &Path, o: &Opts, class: &str, n: usize, side: Side) -> Run {
    let mut cmd = command(dir, o, class, n, side);
    let out = cmd.output().unwrap_or_else(|e| {
        eprintln!("cg-bench: running {:?}: {e}", cmd.get_program());
        std::process::exit(1)
    });
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let mops = number_after(&stdout, "Mop/s total");
    let class_ops = nas_cg::npb::Class::by_name(class).expect("checked");
    let failed = |why: &str| -> ! {
        eprintln!("{stdout}{stderr}");
        eprintln!("cg-bench: class {class} at {n} ranks, {}: {why}", side.name());
        std::process::exit(1)
    };
    if !out.status.success() || !stdout.contains("VERIFICATION SUCCESSFUL") {
        failed("the run failed or did not verify");
    }
    let Some(mops) = mops.filter(|m| *m > 0.0) else { failed("no Mop/s in the report") };
    // Mop/s = ops / seconds / 1e6 (NPB's formula, ours alike), so the
    // time follows from it, with more digits than the printed time.
    let seconds = class_ops.mops(1.0) / mops;
    let comm = if n > 1 && side != Side::Npb { comm_seconds(&format!("{stdout}{stderr}")).unwrap_or_else(|| failed("no cg timers on stderr")) } else { 0.0 };
    Run { seconds, mops, comm }
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// Linear interpolation between order statistics.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let x = q * (s.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
}

/// Two-sided sign test: the chance of a split at least as uneven as
/// `k` of `n` when each round is a fair coin.
fn sign_test(k: usize, n: usize) -> f64 {
    let m = k.min(n - k);
    let ln_choose = |i: usize| -> f64 { (1..=i).map(|j| ((n - i + j) as f64 / j as f64).ln()).sum() };
    let tail: f64 = (0..=m).map(|i| (ln_choose(i) - n as f64 * 2f64.ln()).exp()).sum();
    (2.0 * tail).min(1.0)
}

fn main() {
    let o = parse();
    let dir = std::env::current_exe().expect("own path").parent().expect("a directory").to_path_buf();
    let other = if o.npb.is_some() { Side::Npb } else { Side::Tcp };
    if let Some(npb) = &o.npb {
        for class in &o.classes {
            if npb_binary(npb, class).is_none() {
                eprintln!("cg-bench: no cg.{class}.x in {} or its bin/\n{NPB_HOWTO}", npb.display());
                std::process::exit(1)
            }
        }
    }
    let cells: Vec<(String, usize)> = o.classes.iter().flat_map(|c| o.ranks.iter().map(move |&n| (c.clone(), n))).collect();
    // results[cell] = (via runs, other side's runs), one per round.
    let mut results: Vec<(Vec<Run>, Vec<Run>)> = vec![(Vec::new(), Vec::new()); cells.len()];
    for round in 0..o.rounds {
        let order = if round % 2 == 0 { [Side::Via, other] } else { [other, Side::Via] };
        for (i, (class, n)) in cells.iter().enumerate() {
            for side in order {
                let r = run_once(&dir, &o, class, *n, side);
                eprintln!("cg-bench: round {} class {class} ranks {n} {}: {:.3} s, {:.1} Mop/s, communication {:.1} ms", round + 1, side.name(), r.seconds, r.mops, r.comm * 1e3);
                let slot = if side == Side::Via { &mut results[i].0 } else { &mut results[i].1 };
                slot.push(r);
            }
        }
    }
    let device = if o.nic_only { "the software NIC alone" } else { "the composite device" };
    if other == Side::Npb {
        let btl = if o.nic_only { "btl self,tcp" } else { "shared memory, vader" };
        println!("CG, ours (MTTL over VIA, {device}) against NPB-MPI CG on Open MPI ({btl}), {} alternating rounds, medians; all runs verified", o.rounds);
        println!("class ranks  ours time (IQR)       NPB time (IQR)        ours/NPB per round (quartiles)  ours faster  sign test p");
    } else {
        println!("CG, VIA layer ({device}) against TCP layer, {} rounds, medians; all runs verified", o.rounds);
        println!("class ranks  VIA time  VIA Mop/s  TCP time  TCP Mop/s   VIA/TCP per round (quartiles)  VIA faster  sign test p   comm VIA ms  TCP ms");
    }
    for ((class, n), (via, them)) in cells.iter().zip(&results) {
        let pick = |v: &[Run], f: fn(&Run) -> f64| v.iter().map(f).collect::<Vec<f64>>();
        let ratios: Vec<f64> = via.iter().zip(them).map(|(a, b)| a.seconds / b.seconds).collect();
        let faster = ratios.iter().filter(|&&r| r < 1.0).count();
        let (ours, theirs) = (pick(via, |r| r.seconds), pick(them, |r| r.seconds));
        let ratio = format!("{:5.3} ({:5.3}-{:5.3})          {faster:3} of {:<3}  {:9.3}", median(&ratios), quantile(&ratios, 0.25), quantile(&ratios, 0.75), ratios.len(), sign_test(faster, ratios.len()));
        if other == Side::Npb {
            let iqr = |v: &[f64]| quantile(v, 0.75) - quantile(v, 0.25);
            println!("  {class}   {n:4}  {:7.3} s ({:5.3} s)   {:7.3} s ({:5.3} s)   {ratio}", median(&ours), iqr(&ours), median(&theirs), iqr(&theirs));
            continue;
        }
        let comm = if *n > 1 { format!("{:12.1} {:7.1}", median(&pick(via, |r| r.comm)) * 1e3, median(&pick(them, |r| r.comm)) * 1e3) } else { format!("{:>12} {:>7}", "-", "-") };
        println!("  {class}   {n:4}  {:7.2} s {:10.1}  {:7.2} s {:10.1}   {ratio}   {comm}", median(&ours), median(&pick(via, |r| r.mops)), median(&theirs), median(&pick(them, |r| r.mops)));
    }
    for class in &o.classes {
        let time = |n: usize, via: bool| cells.iter().position(|(c, k)| c == class && *k == n).map(|i| median(&if via { &results[i].0 } else { &results[i].1 }.iter().map(|r| r.seconds).collect::<Vec<_>>()));
        if let (Some(v1), Some(v2), Some(t1), Some(t2)) = (time(1, true), time(2, true), time(1, false), time(2, false)) {
            let (us, them) = if other == Side::Npb { ("ours", "NPB") } else { ("VIA", "TCP") };
            println!("class {class}: speed-up of 2 ranks over 1 (medians): {us} {:.2}, {them} {:.2}", v1 / v2, t1 / t2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_test_matches_the_binomial() {
        // 5 of 5 one way: 2 / 32.
        assert!((sign_test(5, 5) - 0.0625).abs() < 1e-12);
        assert!((sign_test(0, 5) - 0.0625).abs() < 1e-12);
        // 2 of 4: as even as it gets.
        assert_eq!(sign_test(2, 4), 1.0);
        // 15 of 20: 2 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 2^20.
        assert!((sign_test(15, 20) - 2.0 * 21700.0 / 1048576.0).abs() < 1e-12);
    }

    #[test]
    fn quantiles_interpolate() {
        let v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(median(&v), 2.5);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert_eq!(quantile(&v, 0.25), 1.75);
    }

    #[test]
    fn timers_are_read_from_the_ranks_lines() {
        let err = "[0] cg timers, rank 0: local products 0.487 s, product exchange 0.039 s, dot sums 0.009 s\n\
                   [1] cg timers, rank 1: local products 0.488 s, product exchange 0.030 s, dot sums 0.008 s\n";
        assert!((comm_seconds(err).unwrap() - 0.038).abs() < 1e-12);
        assert_eq!(comm_seconds("nothing"), None);
        assert_eq!(number_after(" Mop/s total     =      2392.80\n", "Mop/s total"), Some(2392.8));
    }
}
