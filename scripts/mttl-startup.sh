#!/usr/bin/env bash
# Start-up time and memory of MTTL over VIA, the same hour, alternating:
# `mttl-run -n N -- mttl-check ring` (each rank invokes its neighbour;
# rank 0 starts them all) at each rank count, in the modes
#   demand  this build's default: connections on demand, one receive pool
#   all     this build with every pair connected at start-up
#           (MTTL_VIA_CONNECT=all), still one receive pool
#   before  with BEFORE=<git revision>: that revision's build as it was
#           (e.g. f6cf985^: all connected, receives posted per peer),
#           built once in a worktree under /tmp
# Prints per run the wall time of the whole job and the median of the
# ranks' peak resident memory (VmHWM), then medians over the rounds and
# the ratios demand/all (and demand/before).
# Usage: [BEFORE=REV] scripts/mttl-startup.sh [ROUNDS] [RANKS...]   (default 3; 8 32 64)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"; shift || true
ranks=("$@")
[ $# -eq 0 ] && ranks=(8 32 64)
cargo build --release -q -p mttl-via
bin=target/release
modes_all=(all demand)
if [ -n "${BEFORE:-}" ]; then
    rev=$(git rev-parse --short "$BEFORE")
    wt=/tmp/mttl-before-$rev
    [ -d "$wt" ] || git worktree add -f --detach "$wt" "$rev" >/dev/null
    (cd "$wt" && cargo build --release -q -p mttl-via)
    before_bin=$wt/target/release
    modes_all=(before all demand)
fi
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
printf '%-6s %-7s %5s %10s %14s\n' ranks mode round seconds "median KiB"
declare -A secs kib
for n in "${ranks[@]}"; do
    for r in $(seq 1 "$rounds"); do
        # Alternate the order of the modes from round to round.
        modes=("${modes_all[@]}"); [ $((r % 2)) -eq 0 ] && modes=($(printf '%s\n' "${modes_all[@]}" | tac))
        for m in "${modes[@]}"; do
            out="$(mktemp)"
            b=$bin connect=$m
            [ "$m" = before ] && b=$before_bin connect=all
            t0=$(date +%s.%N)
            if ! MTTL_VIA_CONNECT=$connect timeout 900 "$b/mttl-run" -n "$n" -- "$b/mttl-check" ring >"$out" 2>&1; then
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
    if [ -n "${BEFORE:-}" ]; then
        sb=$(echo ${secs[$n,before]} | tr ' ' '\n' | median); kb=$(echo ${kib[$n,before]} | tr ' ' '\n' | median)
        awk -v n="$n" -v sd="$sd" -v sb="$sb" -v kd="$kd" -v kb="$kb" -v rev="$rev" 'BEGIN {
            printf "%3s ranks: on demand %6.2f s against %6.2f s before (%s) (%.3f); peak memory per rank %d KiB against %d KiB (%.3f)\n", n, sd, sb, rev, sd / sb, kd, kb, kd / kb }'
    fi
done
