#!/usr/bin/env bash
# Two builds of via-pingpong against each other over the bare shared-memory
# wire, in alternating pairs (the order flips every pair): the 64 B
# ping-pong's typical and average one-way time of each, the ratio new/old
# of each pair, the medians and in how many pairs the new one was lower.
# The machine drifts within minutes, so only pairs taken back to back
# compare; a ratio within a few percent of 1 over few pairs is noise.
#
# Usage: scripts/ab-shm.sh OLD_BINARY NEW_BINARY [PAIRS] [ITERS]
#   e.g. cp target/release/via-pingpong /tmp/pp-old; (change, build);
#        scripts/ab-shm.sh /tmp/pp-old target/release/via-pingpong 10
# Server on CPU 0, client on CPU 1, as the demo pins them.
set -euo pipefail
old="${1:?old via-pingpong binary}"
new="${2:?new via-pingpong binary}"
pairs="${3:-8}"
iters="${4:-300000}"
out="$(mktemp -d)"
trap 'rm -rf "$out"; rm -f /dev/shm/via-shm-ab$$-*' EXIT

# One run of BINARY on a wire of its own: "typical avg" one-way us.
run() {
    local bin="$1" wire="ab$$-$2"
    rm -f "/dev/shm/via-shm-$wire" "$out/srv"
    "$bin" server --device "shm:$wire" --cpu 0 --sizes 64 --bw-sizes 64 --iters "$iters" >"$out/srv" 2>&1 &
    local srv=$!
    for _ in $(seq 200); do grep -q READY "$out/srv" && break; sleep 0.05; done
    local mac
    mac="$(awk '/READY/{print $2}' "$out/srv")"
    "$bin" client --json --peer "$mac" --device "shm:$wire" --cpu 1 --sizes 64 --bw-sizes 64 --iters "$iters" 2>/dev/null \
        | tr ',' '\n' | grep -E '"t_typical_us"|"t_avg_us"' | head -2 | cut -d: -f2 | tr '\n' ' '
    wait "$srv" || true
    rm -f "/dev/shm/via-shm-$wire"
}

typ=(); avg=()
for i in $(seq "$pairs"); do
    if [ $((i % 2)) = 1 ]; then o="$(run "$old" o$i)"; n="$(run "$new" n$i)"; else n="$(run "$new" n$i)"; o="$(run "$old" o$i)"; fi
    read -r ot oa <<<"$o"
    read -r nt na <<<"$n"
    rt="$(awk -v a="$nt" -v b="$ot" 'BEGIN {printf "%.3f", a / b}')"
    ra="$(awk -v a="$na" -v b="$oa" 'BEGIN {printf "%.3f", a / b}')"
    typ+=("$rt"); avg+=("$ra")
    echo "pair $i: typical old $ot new $nt ($rt)  avg old $oa new $na ($ra)"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
lower() { printf '%s\n' "$@" | awk '$1 < 1 {c++} END {print c + 0}'; }
echo "new/old: median typical $(median "${typ[@]}") (lower in $(lower "${typ[@]}") of $pairs), median avg $(median "${avg[@]}") (lower in $(lower "${avg[@]}") of $pairs)"
