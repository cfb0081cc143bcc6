#!/usr/bin/env bash
# The C ABI's cost: the C ping-pong of tests/c/twohost.c (64 bytes through
# libvipl; once with VipRecvWait, once through a CQ) against the Rust
# via-pingpong making the same calls (64 bytes, reliable delivery; RecvWait,
# and --recv-cq: CQWait then RecvDone; in both, completed sends reaped with
# SendDone after the round trip was timed) between the same two test hosts, in
# alternating rounds (C first in odd rounds, Rust first in even ones),
# server pinned to CPU 0 and client to CPU 1. Prints
# each round and the medians of the per-round ratios.
# Needs root. Usage: scripts/c-vs-rust-latency.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/veth-pair.sh
rounds="${1:-5}"
cargo build --release -p vipl -p via-pingpong >/dev/null 2>&1
target="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release"
work="$(mktemp -d /tmp/c-vs-rust.XXXXXX)"
a="cvr-a-$$"; b="cvr-b-$$"; va="cva$$"; vb="cvb$$"
cleanup() { remove_hosts "$a" "$b"; rm -rf "$work"; }
trap cleanup EXIT
cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -D_ISOC11_SOURCE -Iinclude tests/c/twohost.c -L"$target" -lvipl -o "$work/twohost"
veth_pair "$a" "$b" "$va" "$vb"
export LD_LIBRARY_PATH="$target"

# $1: the C scenario (pingwait: RecvWait like the Rust loop; pingrcq: receives
# through a CQ, sends reaped with SendDone, like the Rust loop with --recv-cq).
c_round() {
    exec 3< <(ip netns exec "$a" taskset -c 0 "$work/twohost" server "$1" "/dev/via_$va")
    local mac; read -r _ mac <&3
    ip netns exec "$b" taskset -c 1 "$work/twohost" client "$1" "/dev/via_$vb" "$mac" | sed -n 's/^LATENCY_US \([0-9.]*\).*/\1/p'
    exec 3<&-
    wait
}
# $1 (optional): --recv-cq, receives through a CQ like the C CQ scenario.
rust_round() {
    exec 3< <(ip netns exec "$a" "$target/via-pingpong" server --device "/dev/via_$va" --cpu 0 --sizes 64 --bw-sizes "" ${1:-} 2>/dev/null)
    local mac; read -r _ mac <&3
    ip netns exec "$b" "$target/via-pingpong" client --device "/dev/via_$vb" --peer "$mac" --cpu 1 --sizes 64 --bw-sizes "" --json ${1:-} 2>/dev/null \
        | sed -n 's/.*"t_typical_us":\([0-9.]*\).*/\1/p'
    exec 3<&-
    wait
}
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ws=(); cs=(); rs=(); qs=(); wr=(); cr=()
for i in $(seq 1 "$rounds"); do
    # Which of the pair runs first alternates: a machine that drifts
    # within a round favours neither.
    if [ $((i % 2)) -eq 1 ]; then
        w="$(c_round pingwait)"; r="$(rust_round)"; c="$(c_round pingrcq)"; q="$(rust_round --recv-cq)"
    else
        r="$(rust_round)"; w="$(c_round pingwait)"; q="$(rust_round --recv-cq)"; c="$(c_round pingrcq)"
    fi
    ws+=("$w"); rs+=("$r"); cs+=("$c"); qs+=("$q")
    wr+=("$(echo "$w $r" | awk '{printf "%.4f", $1/$2}')"); cr+=("$(echo "$c $q" | awk '{printf "%.4f", $1/$2}')")
    echo "round $i: C (RecvWait) $w us, Rust (RecvWait) $r us, C (CQ) $c us, Rust (CQ) $q us"
done
echo "medians: C (RecvWait) $(median "${ws[@]}") us, Rust (RecvWait) $(median "${rs[@]}") us, C (CQ) $(median "${cs[@]}") us, Rust (CQ) $(median "${qs[@]}") us"
echo "median of per-round ratios: C/Rust with RecvWait = $(median "${wr[@]}"), with a CQ = $(median "${cr[@]}") (target 1.02 each)"
