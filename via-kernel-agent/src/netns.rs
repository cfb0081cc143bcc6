//! Running iproute2's `ip` and nftables' `nft`, for the tools that build
//! test hosts out of network namespaces and veth pairs (`via-pingpong
//! --demo`, `mttl-run`, the cross-host tests) and for `via-agent
//! udp-port`.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `ip ARGS`; the error names the command and what `ip` said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("running ip {}: {e} (is iproute2 installed?)", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// `nft ARGS` with `input` on its standard input, inside network namespace
/// `netns` (`ip netns exec`) or in this process's own; its standard output.
/// The error names the command, the namespace and what `nft` said (and
/// how to install it when it is missing).
pub fn nft(netns: Option<&str>, args: &[&str], input: &str) -> Result<String, String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    let shown = || format!("nft {}{}", args.join(" "), netns.map(|ns| format!(" (namespace {ns})")).unwrap_or_default());
    let mut child = cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("running {}: {e}{}", shown(), nft_hint(&e.to_string())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(|e| format!("writing to {}: {e}", shown()))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("waiting for {}: {e}", shown()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{}: {}{}", shown(), err.trim(), nft_hint(&err)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What to do about an `nft` that is not there.
fn nft_hint(err: &str) -> &'static str {
    if err.contains("No such file") || err.contains("exec of \"nft\" failed") || err.contains("not found") {
        " (nft is missing: apt-get install nftables)"
    } else {
        ""
    }
}
