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
# it boots twice: with 2 NICs and with 4. Needs qemu-system-x86,
# linux-image-amd64 and busybox-static (.ci/run installs them).
#
# The guest is told how many NICs it got (via_nics=N on the kernel command
# line): it fails unless exactly N tulips are bound to vfio-pci, and every
# check needing more NICs than are bound fails (the 4-NIC checks run
# whenever 4 were given). A boot passes only when the suite's last line
# `guest: P passed, F failed, K planned` has P == K > 0, the guest said
# how many tulips it bound and that is N, and it exited 0. --only NAME
# that matches no check fails before booting, naming the known checks
# (`via-guest-suite plan N NAME`). Exits non-zero on any failure, a
# missing result line, or a time-out.
#
# The watchdog: a guest that prints nothing for VIA_QEMU_SILENCE seconds
# (default 120; the suite prints a line at least every minute) has stopped.
# Either way run.sh first saves QEMU's view of the vCPUs (monitor: info
# status, info cpus, info registers -a) into the log and stops that boot.
# - Silent before the suite printed its first line (`guest: suite
#   started`), i.e. in the boot phase: the guest stopped as a whole, which
#   happened under TCG on a loaded 2-core host, once inside SeaBIOS before
#   any of our code ran. That boot is booted once more, and run.sh says so.
# - Silent after the suite started: a hang of ours (driver, library or
#   check). That boot fails with the monitor dump; it is never retried.
# A check that fails is never retried either.
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
    -p via-kernel-agent --bin via-agent -p via-pingpong --bin via-pingpong \
    -p via-tests --bin via-testpeer --bin via-conform --bin via-guest-suite \
    -p nas-cg --bin cg
BINDIR=${CARGO_TARGET_DIR:-$ROOT/target}/$TARGET/guest

# The checks each boot plans; an --only that matches none fails here.
for n in "${NICS[@]}"; do
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "--nics $n: the suite needs at least 2 NICs"
    planned=$("$BINDIR/via-guest-suite" plan "$n" "$ONLY") || die "--only $ONLY: unknown check (above)"
    echo "qemu/run.sh: $n NICs: $(echo "$planned" | wc -l) checks to run besides the NIC count${ONLY:+ (--only $ONLY)}"
done

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
# The suite's first line: silence before it is the boot phase, after it a hang.
SUITE_STARTED='^guest: suite started'
RESULT='^guest: [0-9]+ passed, [0-9]+ failed, [0-9]+ planned$'
# boot N LOG: one guest run; returns 0 if the guest printed its result,
# 3 if it fell silent in the boot phase, 4 if it fell silent after the
# suite started (state saved in LOG either way), 1 otherwise.
boot() {
    local n=$1 log=$2 mon=$WORK/monitor i
    local args=(-accel tcg -machine q35 -cpu max -smp 2 -m 1024 -device intel-iommu
          -kernel "$KERNEL" -initrd "$WORK/initrd.gz"
          -append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=3 printk.devkmsg=on printk.time=0 via_nics=$n via_only=$ONLY$ENVS"
          -nographic -no-reboot -nodefaults -serial stdio -monitor "pipe:$mon")
    for i in $(seq 0 $((n - 1))); do
        args+=(-netdev "hubport,id=p$i,hubid=0" -device "tulip,netdev=p$i,mac=52:54:00:00:00:$(printf %02x $((i + 1)))")
    done
    rm -f "$mon.in" "$mon.out" "$WORK/silent" "$WORK/hung"
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
            if grep -qaE "$SUITE_STARTED" "$log"; then touch "$WORK/hung"; else touch "$WORK/silent"; fi
            printf 'info status\ninfo cpus\ninfo pic\ninfo irq\ninfo registers -a\n' > "$mon.in"
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
    if [ -e "$WORK/silent" ] || [ -e "$WORK/hung" ]; then
        cat "$log.silent"; cat "$log.silent" >> "$log"; rm -f "$log.silent"
        [ -e "$WORK/hung" ] && return 4
        return 3
    fi
    grep -qaE "$RESULT" "$log" && return 0
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
            echo "qemu/run.sh: $n NICs: the guest stopped before the suite started (silent for ${SILENCE} s after $((t1 - t0)) s; state above); booting it again"
            continue
        fi
        break
    done
    result=$(grep -aE "$RESULT" "$log" | tail -n 1 || true)
    bound=$(grep -aoE '^guest: [0-9]+ tulips bound to vfio-pci' "$log" | tail -n 1 | awk '{print $2}' || true)
    read -r passed failed planned < <(echo "$result" | awk '{print $2, $4, $6}')
    took="$((t1 - t0)) s (attempt $attempt)"
    if [ "$rc" = 3 ]; then
        echo "qemu/run.sh: $n NICs: FAIL: the guest stopped again before the suite started (silent for ${SILENCE} s; state above)"
        status=1
    elif [ "$rc" = 4 ]; then
        echo "qemu/run.sh: $n NICs: FAIL: the guest hung in the suite (silent for ${SILENCE} s after it started, $took; state above; not retried)"
        status=1
    elif [ -z "$result" ]; then
        echo "qemu/run.sh: $n NICs: FAIL: no result from the guest after $took (crash or time-out)"
        status=1
    elif [ "$bound" != "$n" ]; then
        echo "qemu/run.sh: $n NICs: FAIL: ${bound:-no count of} tulips bound to vfio-pci, $n given; $result, $took"
        status=1
    elif [ "$planned" = 0 ] || [ "$passed" != "$planned" ] || [ "$failed" != 0 ]; then
        echo "qemu/run.sh: $n NICs: FAIL: $result (every planned check must pass, and some be planned), $took"
        status=1
    elif ! grep -q '^GUEST-EXIT 0' "$log"; then
        echo "qemu/run.sh: $n NICs: FAIL: $result but the guest exited non-zero ($(grep -a '^GUEST-EXIT' "$log" | tail -n 1)), $took"
        status=1
    else
        echo "qemu/run.sh: $n NICs: $bound tulips bound; $result in $took"
    fi
done
exit $status
