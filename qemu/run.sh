#!/bin/bash
# The QEMU harness for the tulip/VFIO path, in one command:
#
#   qemu/run.sh [--nics N]... [--only NAME] [--env VAR=VALUE]... [--timeout SECONDS]
#
# builds the guest binaries statically (via-agent, via-pingpong,
# via-testpeer, via-conform, via-guest-suite, cg), builds an initramfs from
# busybox and the VFIO modules of the Debian kernel package, boots a q35
# guest under TCG with the emulated intel-iommu and N tulip NICs on one
# QEMU hub, lets qemu/init bind every tulip with via-agent and run
# via-guest-suite, and reads the result from the serial console. By default
# it boots twice: with 2 NICs and with 4. Exits non-zero on any failure,
# a missing result line, or a time-out. Needs qemu-system-x86,
# linux-image-amd64 and busybox-static (.ci/run installs them).
#
# A guest that prints nothing for VIA_QEMU_SILENCE seconds (default 120;
# the suite prints a line at least every minute) has stopped as a whole:
# this happened under TCG on a loaded 2-core host, once inside SeaBIOS
# before any of our code ran. run.sh then saves QEMU's view of the vCPUs
# (monitor: info status, info cpus, info registers -a) into the log, stops
# that boot and boots it once more, and says so; a check that fails is
# never retried.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NICS=()
ONLY=""
ENVS=""
TIMEOUT=${VIA_QEMU_TIMEOUT:-600}
while [ $# -gt 0 ]; do
    case "$1" in
        --nics) NICS+=("$2"); shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --env) ENVS="$ENVS via_env=$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        *) echo "usage: qemu/run.sh [--nics N]... [--only NAME] [--env VAR=VALUE]... [--timeout SECONDS]" >&2; exit 2 ;;
    esac
done
[ ${#NICS[@]} -gt 0 ] || NICS=(2 4)

die() { echo "qemu/run.sh: $*" >&2; exit 1; }
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] || die "busybox missing (apt-get install busybox-static)"
file -L "$BUSYBOX" 2>/dev/null | grep -q "statically linked" || ldd "$BUSYBOX" 2>&1 | grep -q "not a dynamic" || die "$BUSYBOX is not static (apt-get install busybox-static)"
KERNEL=$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)
[ -n "$KERNEL" ] || die "no kernel in /boot (apt-get install linux-image-amd64)"
KVER=${KERNEL#/boot/vmlinuz-}
MODDIR=/lib/modules/$KVER
[ -d "$MODDIR" ] || die "no modules for $KVER in $MODDIR"

# 1. Static binaries (a target directory of their own keeps the host build).
TARGET=x86_64-unknown-linux-gnu
echo "qemu/run.sh: building static guest binaries"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --manifest-path "$ROOT/Cargo.toml" --profile guest --target $TARGET \
    -p via-kernel-agent --bin via-agent -p via-user --bin via-pingpong \
    -p via-tests --bin via-testpeer --bin via-conform --bin via-guest-suite \
    -p nas-cg --bin cg
BINDIR=${CARGO_TARGET_DIR:-$ROOT/target}/$TARGET/guest

# 2. The initramfs.
WORK=$(mktemp -d /tmp/via-qemu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
IRD=$WORK/root
mkdir -p "$IRD"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$BUSYBOX" "$IRD/bin/busybox"
for b in via-agent via-pingpong via-testpeer via-conform via-guest-suite cg; do
    cp "$BINDIR/$b" "$IRD/bin/"
done
cp "$ROOT/qemu/init" "$IRD/init"
chmod +x "$IRD/init"
# vfio-pci and what it depends on, in load order (from modules.dep).
order=()
add_module() {
    local rel=$1 dep
    for dep in $(awk -F': ' -v m="$rel" '$1 == m { print $2 }' "$MODDIR/modules.dep"); do
        add_module "$dep"
    done
    local name; name=$(basename "$rel"); name=${name%%.ko*}
    for o in "${order[@]:-}"; do [ "$o" = "$name" ] && return; done
    case "$rel" in
        *.ko) cp "$MODDIR/$rel" "$IRD/lib/modules/$name.ko" ;;
        *.ko.xz) xz -dc "$MODDIR/$rel" > "$IRD/lib/modules/$name.ko" ;;
        *.ko.zst) zstd -qdc "$MODDIR/$rel" > "$IRD/lib/modules/$name.ko" ;;
        *.ko.gz) gzip -dc "$MODDIR/$rel" > "$IRD/lib/modules/$name.ko" ;;
    esac
    order+=("$name")
}
for m in vfio-pci vfio_iommu_type1; do
    rel=$(awk -F: -v m="$m" '{ n=$1; sub(/.*\//, "", n); sub(/\.ko.*/, "", n) } n == m { print $1 }' "$MODDIR/modules.dep")
    [ -n "$rel" ] || die "module $m not found in $MODDIR"
    add_module "$rel"
done
printf '%s\n' "${order[@]}" > "$IRD/lib/modules/order"
(cd "$IRD" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initrd.gz"

# 3. Boot, once per NIC count.
SILENCE=${VIA_QEMU_SILENCE:-120}
# boot N LOG: one guest run; returns 0 if the guest printed its result,
# 3 if it fell silent (state saved in LOG), 1 otherwise.
boot() {
    local n=$1 log=$2 mon=$WORK/monitor i
    local args=(-accel tcg -machine q35 -cpu max -smp 2 -m 1024 -device intel-iommu
          -kernel "$KERNEL" -initrd "$WORK/initrd.gz"
          -append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=3 via_only=$ONLY$ENVS"
          -nographic -no-reboot -nodefaults -serial stdio -monitor "pipe:$mon")
    for i in $(seq 0 $((n - 1))); do
        args+=(-netdev "hubport,id=p$i,hubid=0" -device "tulip,netdev=p$i,mac=52:54:00:00:00:$(printf %02x $((i + 1)))")
    done
    rm -f "$mon.in" "$mon.out" "$WORK/silent"
    mkfifo "$mon.in" "$mon.out"
    : > "$log"
    # The monitor's answers, read all along so that its pipe never fills.
    cat "$mon.out" > "$log.monitor" &
    local reader=$!
    # The watchdog: the log's size every 5 s; after SILENCE s unchanged,
    # ask the monitor what the vCPUs are doing, then quit QEMU.
    (
        last=-1; quiet=0
        while sleep 5; do
            size=$(stat -c %s "$log" 2>/dev/null || echo 0)
            if [ "$size" != "$last" ]; then last=$size; quiet=0; continue; fi
            quiet=$((quiet + 5))
            [ "$quiet" -ge "$SILENCE" ] || continue
            touch "$WORK/silent"
            printf 'info status\ninfo cpus\ninfo registers -a\n' > "$mon.in"
            sleep 5
            {
                echo "qemu/run.sh: the guest printed nothing for ${quiet} s; QEMU's monitor says:"
                tr -d '\r' < "$log.monitor" | grep -avE '^(QEMU .* monitor|\(qemu\)|YMM|FPR)' | sed 's/^/monitor: /'
            } > "$log.silent"
            echo quit > "$mon.in"
            sleep 10
            pkill -KILL -f -- "pipe:$mon" || true
            break
        done
    ) &
    local watchdog=$!
    set +e
    timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 "${args[@]}" </dev/null 2>&1 | sed -u 's/\r$//' | tee "$log"
    set -e
    kill "$watchdog" "$reader" 2>/dev/null; wait "$watchdog" "$reader" 2>/dev/null || true
    if [ -e "$WORK/silent" ]; then
        cat "$log.silent"; cat "$log.silent" >> "$log"; rm -f "$log.silent"
        return 3
    fi
    grep -qE '^guest: [0-9]+ passed, [0-9]+ failed' "$log" && return 0
    return 1
}

status=0
for n in "${NICS[@]}"; do
    log=$WORK/guest-$n.log
    for attempt in 1 2; do
        echo "qemu/run.sh: booting a guest with $n tulip NICs (time limit ${TIMEOUT}s, attempt $attempt)"
        t0=$(date +%s)
        rc=0; boot "$n" "$log" || rc=$?
        t1=$(date +%s)
        [ -n "${VIA_QEMU_LOGDIR:-}" ] && cp "$log" "$VIA_QEMU_LOGDIR/guest-$n-attempt$attempt.log"
        if [ "$rc" = 3 ] && [ "$attempt" = 1 ]; then
            echo "qemu/run.sh: $n NICs: the guest stopped (silent for ${SILENCE} s after $((t1 - t0)) s; state above); booting it again"
            continue
        fi
        break
    done
    result=$(grep -E '^guest: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
    if [ "$rc" = 3 ]; then
        echo "qemu/run.sh: $n NICs: the guest stopped again (silent for ${SILENCE} s; state above)"
        status=1
    elif [ -z "$result" ]; then
        echo "qemu/run.sh: $n NICs: no result from the guest after $((t1 - t0)) s (crash or time-out)"
        status=1
    elif ! grep -q '^GUEST-EXIT 0' "$log"; then
        echo "qemu/run.sh: $n NICs: $result (failures above), $((t1 - t0)) s"
        status=1
    else
        echo "qemu/run.sh: $n NICs: $result in $((t1 - t0)) s (attempt $attempt)"
    fi
done
exit $status
