#!/usr/bin/env bash
# Makes the profile that optimized builds use (pgo/via.profdata;
# scripts/rustc-pgo applies it): builds the programs users run
# (via-pingpong, mttl-run and mttl-bench, cg) with the compiler's
# instrumentation, as the README builds them; runs what they are measured
# with (the demo's transports, MTTL's benchmarks, CG class A at 2 ranks on
# shared memory and over the NIC); merges the counts; and leaves the
# release build to be made again with them. Run it after changing the
# engine: a function whose code changed since the profile was made is
# compiled without it (silently: it is merely not guided).
#
# Needs root (the demo's and mttl-run's network namespaces) and the
# llvm-profdata of rustc's LLVM major version (apt-get install llvm-N).
# Usage: scripts/pgo-profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
major="$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')"
profdata="$(command -v "llvm-profdata-$major" || true)"
[ -n "$profdata" ] || profdata="/usr/lib/llvm-$major/bin/llvm-profdata"
[ -x "$profdata" ] || { echo "needs llvm-profdata of LLVM $major (rustc's): apt-get install llvm-$major" >&2; exit 1; }

raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
# The instrumented builds (scripts/rustc-pgo adds the instrumentation):
# the programs as users build them, since a crate's symbols, which the
# profile names, depend on the features its build unifies. The README's
# demo (`cargo run --release --bin via-pingpong`) and a build of every
# program (`--workspace --bins`) take the whole workspace's features; the
# README's MTTL commands (`-p mttl-via`, `-p nas-cg`) those of their own
# packages. Cargo does not see the instrumentation: target folders of
# their own, new.
whole="$PWD/target/pgo-gen"
alone="$PWD/target/pgo-gen-alone"
rm -rf "$whole" "$alone"
VIA_PGO_GENERATE="$raw/build" CARGO_TARGET_DIR="$whole" cargo build --release -q --workspace --bins
for p in mttl-via nas-cg; do
    VIA_PGO_GENERATE="$raw/build" CARGO_TARGET_DIR="$alone" cargo build --release -q -p "$p"
done
export LLVM_PROFILE_FILE="$raw/run/%p-%m.profraw"
echo "pgo-profile: the demo's transports" >&2
"$whole/release/via-pingpong" --demo --quick --rounds 1 --transports raw,via,via-auth,via-shm,via-udp,via-unrel,via-write,via-read >/dev/null
# The small message, which the demo's targets are about, weighed as the
# demo's rounds weigh it: 64 B latency alone, at length.
echo "pgo-profile: 64 B latency" >&2
"$whole/release/via-pingpong" --demo --rounds 1 --iters 300000 --sizes 64 --bw-sizes 64 --transports raw,via,via-shm,via-udp >/dev/null
for bin in "$whole/release" "$alone/release"; do
    echo "pgo-profile: MTTL's benchmarks ($bin)" >&2
    MTTL_BENCH_SIZES=32,2048,131072 "$bin/mttl-bench" nread invoke exchange --paths via,via-shm --rounds 1 --quick >/dev/null
    echo "pgo-profile: CG class A at 2 ranks, shared memory and the NIC ($bin)" >&2
    "$bin/mttl-run" -n 2 -- "$bin/cg" --class A >/dev/null
    "$bin/mttl-run" -n 2 --nic-only -- "$bin/cg" --class A >/dev/null
done
mkdir -p pgo
"$profdata" merge -o pgo/via.profdata "$raw"/run/*.profraw
echo "$major" >pgo/LLVM
# Cargo does not see the profile, which every crate of the build takes:
# the release build starts again.
cargo clean --release -q
echo "pgo-profile: wrote pgo/via.profdata ($(du -k pgo/via.profdata | cut -f1) KiB) for LLVM $major; the next release build uses it" >&2
