//! Builds `probe/sockprobe.c`, the C reference ping-pong that
//! `via-pingpong --demo` runs beside its own tcp and udp baselines; the
//! binary is embedded into via-pingpong (`include_bytes!`). Without a C
//! compiler the probe is left empty and the demo says it is missing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "probe/sockprobe.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("sockprobe");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc).args(["-O2", "-Wall", "-Wextra", "-o"]).arg(&out).arg(src).status();
    match built {
        Ok(s) if s.success() => {}
        other => {
            println!("cargo:warning=the C probe ({src}) did not build with {cc}: {other:?}; via-pingpong --demo will report it missing");
            std::fs::write(&out, b"").expect("writing the empty probe");
        }
    }
}
