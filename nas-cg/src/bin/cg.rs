//! `cg [--class S|W|A|B|C]`: NPB CG on MTTL. Start it with `mttl-run -n N
//! -- cg --class A` (N a power of two), or alone for one process. Prints
//! NPB's report; exits 1 when verification fails.

use mttl_via::{my_pe, on_all, pe_num, remote};
use nas_cg::{dist, npb::Class};

remote! {
    fn cg_phase(class: String) -> (f64, f64, f64) {
        let c = Class::by_name(&class).expect("class checked by rank 0");
        let show = my_pe() == 0;
        let out = dist::run(&c, |it, rnorm, zeta| {
            if show {
                if it == 1 {
                    println!("\n   iteration           ||r||                 zeta");
                }
                println!("    {it:5}       {rnorm:20.14E}{zeta:20.13}");
            }
        })
        .unwrap_or_else(|e| panic!("{e}"));
        (out.zeta, out.rnorm, out.seconds)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = match args.iter().position(|a| a == "--class") {
        Some(i) => args.get(i + 1).cloned().unwrap_or_default(),
        None if args.is_empty() => "S".into(),
        None => {
            eprintln!("usage: cg [--class S|W|A|B|C]");
            std::process::exit(2)
        }
    };
    let Some(class) = Class::by_name(&name) else {
        eprintln!("cg: unknown class {name:?} (S, W, A, B or C)");
        std::process::exit(2)
    };
    mttl_via::run(move || {
        let p = pe_num();
        println!("\n\n NAS Parallel Benchmarks (via-rs, MTTL over {}) - CG Benchmark\n", std::env::var("MTTL_TRANSPORT").unwrap_or_else(|_| "via".into()));
        println!(" Size: {:>10}", class.na);
        println!(" Iterations: {:>5}", class.niter);
        println!(" Number of active processes: {p:>5}");
        println!(" Number of nonzeroes per row: {:>8}", class.nonzer);
        println!(" Eigenvalue shift: {:.3E}", class.shift);
        let results = on_all(cg_phase, (class.name.to_string(),));
        let (zeta, _rnorm, secs) = results[0];
        let ok = class.verify(zeta);
        println!(" Benchmark completed");
        if ok {
            println!(" VERIFICATION SUCCESSFUL");
        } else {
            println!(" VERIFICATION FAILED");
        }
        println!(" Zeta is    {zeta:20.13E}");
        println!(" Error is   {:20.13E}", (zeta - class.zeta_verify).abs() / class.zeta_verify);
        let mops = class.mops(secs);
        println!("\n\n CG Benchmark Completed.");
        println!(" Class           = {:>24}", class.name);
        println!(" Size            = {:>24}", class.na);
        println!(" Iterations      = {:>24}", class.niter);
        println!(" Time in seconds = {secs:>24.2}");
        println!(" Total processes = {p:>24}");
        println!(" Mop/s total     = {mops:>24.2}");
        println!(" Mop/s/process   = {:>24.2}", mops / p as f64);
        println!(" Operation type  = {:>24}", "floating point");
        println!(" Verification    = {:>24}", if ok { "SUCCESSFUL" } else { "UNSUCCESSFUL" });
        if !ok {
            panic!("CG class {} did not verify: zeta {zeta} against {}", class.name, class.zeta_verify);
        }
    });
}
