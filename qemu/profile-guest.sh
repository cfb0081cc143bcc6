#!/bin/bash
# Guest instructions per function of via-pingpong's bandwidth stream on two
# tulips in the TCG guest, raw frames and VIA each alone (20,000 messages
# of 1436 bytes, both ends), counted by a TCG plugin (qemu/profile/tbcount.c)
# and charged to functions (qemu/profile/symbolize.py).
#
#   qemu/profile-guest.sh [TOP]
#
# The guest binaries are built non-PIE (relocation-model=static, in a
# target directory of their own) so that guest addresses are the binary's.
# Needs what qemu/run.sh needs, and gcc and python3. Each transport is one
# boot (~30 s). The counts include the boot (kernel and "elsewhere"): compare
# the binary's counts, which are the benchmark's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOP=${1:-30}
OUT=$(mktemp -d /tmp/via-profile.XXXXXX)
gcc -O2 -shared -fPIC -o "$OUT/tbcount.so" "$ROOT/qemu/profile/tbcount.c"
export CARGO_TARGET_DIR=${VIA_PROFILE_TARGET:-$ROOT/target/profile-guest}
export VIA_GUEST_RUSTFLAGS="-C relocation-model=static"
# The bench's own build (qemu/run.sh: `release` for --only bench).
export VIA_GUEST_PROFILE=${VIA_GUEST_PROFILE:-release}
export VIA_QEMU_ARGS="-plugin $OUT/tbcount.so"
for t in raw via; do
    TBCOUNT_OUT="$OUT/$t.txt" "$ROOT/qemu/run.sh" --boot tulip:2 --only bench --env VIA_GUEST_BENCH_ONE=$t > "$OUT/$t.log" 2>&1 \
        || { echo "qemu/profile-guest.sh: the $t boot failed (log: $OUT/$t.log)" >&2; exit 1; }
    echo "== $t ($(grep -o 'bench tulip-tulip .* alone: .*' "$OUT/$t.log" | head -1))"
    python3 "$ROOT/qemu/profile/symbolize.py" "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/$VIA_GUEST_PROFILE/via-pingpong" "$OUT/$t.txt" "$TOP"
done
echo "(counts and logs in $OUT)"
