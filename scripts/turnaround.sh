#!/usr/bin/env bash
# The turnaround probe (via-device's `probe` feature): on the README
# demo's link (two network namespaces joined by a veth pair; WIRE=shm: a
# shared-memory wire between the two processes instead), the server on
# CPU 0 and the client on CPU 1, how long the server takes from first
# seeing a 64-byte ping to handing its pong to the kernel (on the wire:
# publishing it), and where that time goes, for VIA and for raw frames on
# the same device, in alternating runs. The engine_cost bench counts the
# engine's work with warm caches; this times it where the kernel's work
# between messages has cooled them.
#
# Each line: the one-way time the client measured; the server's medians,
# in ns from the first sighting of the ping, at each stage the build
# marks (via-device/src/probe.rs); on the link, how long its sendmmsg took
# and how long after the kernel's time stamp of the ping the device saw
# it. Each mark costs ~10 ns: on the wire, where a one-way message takes
# ~0.15 us, they add visibly to VIA's time (eight marks against raw's two).
#
# Builds via-pingpong with the probe into target/probe (PROBE_TARGET: another
# folder; the normal build is untouched); SIZE=N pings of N bytes. As root.
# Usage: [WIRE=shm] scripts/turnaround.sh [RUNS] [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
iters="${2:-200000}"
wire="${WIRE:-link}"
[ "$(id -u)" = 0 ] || [ "$wire" = shm ] || { echo "needs root (network namespaces)" >&2; exit 1; }
CARGO_TARGET_DIR="${PROBE_TARGET:-target/probe}" cargo build --release -q -p via-pingpong --features via-device/probe
bin="$PWD/${PROBE_TARGET:-target/probe}/release/via-pingpong"
a="ta$$"; b="tb$$"; out="$(mktemp -d)"
cleanup() {
    if [ "$wire" != shm ]; then ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; fi
    rm -f "/dev/shm/via-shm-$a"; rm -rf "$out"
}
trap cleanup EXIT
if [ "$wire" = shm ]; then
    server=(); client=(); sdev="shm:$a"; cdev="shm:$a"
else
    ip netns add "$a"; ip netns add "$b"
    ip link add "v$a" type veth peer name "v$b"
    ip link set "v$a" netns "$a"; ip link set "v$b" netns "$b"
    for n in "$a" "$b"; do ip -n "$n" link set lo up; ip -n "$n" link set "v$n" up; done
    server=(ip netns exec "$a"); client=(ip netns exec "$b"); sdev="/dev/via_v$a"; cdev="/dev/via_v$b"
fi
one() {
    local t="$1" size="${SIZE:-64}"
    rm -f "/dev/shm/via-shm-$a"
    "${server[@]}" "$bin" server --transport "$t" --device "$sdev" --cpu 0 --sizes "$size" --bw-sizes 64 --iters "$iters" --bw-iters 10 >"$out/srv" 2>&1 &
    local srv=$!
    for _ in $(seq 200); do grep -q READY "$out/srv" && break; sleep 0.05; done
    local mac lat
    mac="$(awk '/READY/{print $2}' "$out/srv")"
    lat="$("${client[@]}" "$bin" client --json --transport "$t" --device "$cdev" --peer "$mac" --cpu 1 --sizes "$size" --bw-sizes 64 --iters "$iters" --bw-iters 10 2>/dev/null \
        | tr ',' '\n' | grep '"t_typical_us"' | head -1 | cut -d: -f2)"
    wait "$srv" || true
    echo "$t: one-way typical ${lat} us; $(grep '^turnaround' "$out/srv" | sed 's/^turnaround server [a-z]*: //')"
}
for i in $(seq "$runs"); do
    if [ $((i % 2)) = 1 ]; then one raw; one via; else one via; one raw; fi
done
