#!/usr/bin/env bash
# Start-up time and memory of MTTL over VIA with connections on demand
# against every pair connected at start-up (MTTL_VIA_CONNECT=all), the
# same hour, alternating: `mttl-run -n N -- mttl-check ring` (each rank
# invokes its neighbour; rank 0 starts them all), at each rank count.
# Prints per run the wall time of the whole job and the median of the
# ranks' peak resident memory (VmHWM), then medians over the rounds and
# the ratios demand/all.
# Usage: scripts/mttl-startup.sh [ROUNDS] [RANKS...]   (default 3; 8 32 64)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"; shift || true
ranks=("$@")
[ $# -eq 0 ] && ranks=(8 32 64)
cargo build --release -q -p mttl-via
bin=target/release
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
printf '%-6s %-7s %5s %10s %14s\n' ranks mode round seconds "median KiB"
declare -A secs kib
for n in "${ranks[@]}"; do
    for r in $(seq 1 "$rounds"); do
        # Alternate which mode goes first from round to round.
        modes=(all demand); [ $((r % 2)) -eq 0 ] && modes=(demand all)
        for m in "${modes[@]}"; do
            out="$(mktemp)"
            t0=$(date +%s.%N)
            if ! MTTL_VIA_CONNECT=$m timeout 900 "$bin/mttl-run" -n "$n" -- "$bin/mttl-check" ring >"$out" 2>&1; then
                echo "run failed: $n ranks, $m (output follows)" >&2; tail -20 "$out" >&2; rm -f "$out"; exit 1
            fi
            t1=$(date +%s.%N)
            s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
            k=$(sed -n 's/.*peak resident memory \([0-9]*\) KiB.*/\1/p' "$out" | median)
            rm -f "$out"
            printf '%-6s %-7s %5s %10.2f %14s\n' "$n" "$m" "$r" "$s" "$k"
            secs[$n,$m]+="$s "; kib[$n,$m]+="$k "
        done
    done
done
echo
for n in "${ranks[@]}"; do
    sa=$(echo ${secs[$n,all]} | tr ' ' '\n' | median); sd=$(echo ${secs[$n,demand]} | tr ' ' '\n' | median)
    ka=$(echo ${kib[$n,all]} | tr ' ' '\n' | median); kd=$(echo ${kib[$n,demand]} | tr ' ' '\n' | median)
    awk -v n="$n" -v sd="$sd" -v sa="$sa" -v kd="$kd" -v ka="$ka" 'BEGIN {
        printf "%3s ranks: start-up and run %6.2f s on demand against %6.2f s all connected (%.3f); peak memory per rank %d KiB against %d KiB (%.3f)\n", n, sd, sa, sd / sa, kd, ka, kd / ka }'
done
