//! Running iproute2's `ip`, for the tools that build test hosts out of
//! network namespaces and veth pairs (`via-pingpong --demo`, `mttl-run`,
//! the cross-host tests).

use std::process::Command;

/// Runs `ip ARGS`; the error names the command and what `ip` said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("running ip {}: {e} (is iproute2 installed?)", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}
