#!/bin/bash
# The QEMU harness for the VFIO path (tulip and e1000e NICs), in one command:
#
#   qemu/run.sh [--boot KIND:N]... [--nics N]... [--only NAME] [--env VAR=VALUE]... [--timeout SECONDS]
#
# builds the guest binaries statically (via-agent, via-pingpong,
# via-testpeer, via-conform, via-guest-suite, cg), builds an initramfs from
# busybox and the VFIO modules of the Debian kernel package, boots a q35
# guest under TCG with the emulated intel-iommu and N NICs on one QEMU
# hub, lets qemu/init bind every NIC that has a VIA driver with via-agent
# and run via-guest-suite, and reads the result from the serial console.
# Needs qemu-system-x86, linux-image-amd64 and busybox-static (.ci/run
# installs them).
#
# One boot per --boot KIND:N, in the order given: KIND is tulip (DEC 21143,
# QEMU's -device tulip), e1000e (Intel 82574L, -device e1000e) or mixed
# (tulip, e1000e, tulip, ... alternating, so a pair is one of each);
# --nics N is --boot tulip:N. By default it boots five times: tulip:2,
# tulip:4, e1000e:2, e1000e:4, mixed:2.
#
# The guest is told how many NICs it got and of which kinds (via_nics=N
# via_kinds=tulip:1,e1000e:1 on the kernel command line): it fails unless
# exactly that many of each kind are bound to vfio-pci, and every check
# needing more NICs than are bound fails (the 4-NIC checks run whenever 4
# were given). A boot passes only when the suite's last line
# `guest: P passed, F failed, K planned` has P == K > 0, the guest said
# how many NICs of each kind it bound and that is what was given, and it
# exited 0. Each boot's summary line says its kind:
#   qemu/run.sh: 2 e1000e NICs: 2 bound; guest: P passed, F failed, K planned in T s (attempt A)
# (`... NICs: FAIL: why` for a boot that failed), and the run ends with
# one line per kind booted:
#   qemu/run.sh: e1000e: 2 passed, 0 failed (boots)
# --only NAME that matches no check fails before booting, naming the known
# checks (`via-guest-suite plan KINDS NAME`). Exits non-zero on any
# failure, a missing result line, or a time-out.
#
# The watchdog: a guest that prints nothing for VIA_QEMU_SILENCE seconds
# (default 120; the suite prints a line at least every minute) has stopped.
# Either way run.sh first saves QEMU's view of the vCPUs (monitor: info
# status, info cpus, info registers -a) into the log and stops that boot.
# - Silent before the suite printed its first line (`guest: suite
#   started`), i.e. in the boot phase: the guest stopped as a whole, which
#   happened under TCG on a loaded 2-core host, once inside SeaBIOS before
#   any of our code ran. That boot is booted once more, and run.sh says so.
# - Silent after the suite started with every vCPU idle in HLT, or with a
#   vCPU left inside an interrupt (its local APIC shows one in service:
#   the timer's, vector 236, in every case seen): the guest kernel
#   stopped, its timers with it, so not even the suite's own watchdog (it
#   reports a check running 110 s, before the 120 s of silence) ran. A
#   guest-wide stop under TCG like the one above (about 1 boot in 20-35
#   on 2026-11-26). That boot is booted once more, and run.sh says so;
#   twice fails.
# - Silent after the suite started with a vCPU busy and no interrupt in
#   service: a hang of ours (driver, library or check). That boot fails
#   with the monitor dump; it is never retried.
# A check that fails is never retried either.
#
# For profiling (qemu/profile-guest.sh): VIA_QEMU_ARGS adds QEMU arguments
# (a TCG plugin, say; split on spaces), VIA_GUEST_RUSTFLAGS adds rustc flags
# to the guest build (with CARGO_TARGET_DIR elsewhere, so the usual guest
# build stays as it is).
#
# The guest binaries are built with the `guest` profile (no LTO: quick to
# build) for the checks, and with `release` (what users run: fat LTO) for
# `--only bench`, whose figures compare VIA's layered stack with the raw
# loop (LTO took 11.5 % of VIA's guest instructions a message off, 8 % of
# raw's). VIA_GUEST_PROFILE=NAME chooses either way.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
USAGE="usage: qemu/run.sh [--boot KIND:N]... [--nics N]... [--only NAME] [--env VAR=VALUE]... [--timeout SECONDS] (KIND: tulip, e1000e or mixed)"
BOOTS=()
ONLY=""
ENVS=""
TIMEOUT=${VIA_QEMU_TIMEOUT:-600}
while [ $# -gt 0 ]; do
    case "$1" in
        --boot) BOOTS+=("$2"); shift 2 ;;
        --nics) BOOTS+=("tulip:$2"); shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --env) ENVS="$ENVS via_env=$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        *) echo "$USAGE" >&2; exit 2 ;;
    esac
done
[ ${#BOOTS[@]} -gt 0 ] || BOOTS=(tulip:2 tulip:4 e1000e:2 e1000e:4 mixed:2)

die() { echo "qemu/run.sh: $*" >&2; exit 1; }
for b in "${BOOTS[@]}"; do
    [[ "$b" =~ ^(tulip|e1000e|mixed):[0-9]+$ ]] || die "--boot $b: expected KIND:N, KIND one of tulip, e1000e, mixed ($USAGE)"
    [ "${b#*:}" -ge 2 ] || die "--boot $b: the suite needs at least 2 NICs"
done
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
case "$ONLY" in bench*) PROFILE=${VIA_GUEST_PROFILE:-release} ;; *) PROFILE=${VIA_GUEST_PROFILE:-guest} ;; esac
echo "qemu/run.sh: building static guest binaries"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static ${VIA_GUEST_RUSTFLAGS:-}" \
    cargo build --manifest-path "$ROOT/Cargo.toml" --profile "$PROFILE" --target $TARGET \
    -p via-kernel-agent --bin via-agent -p via-pingpong --bin via-pingpong \
    -p via-tests --bin via-testpeer --bin via-conform --bin via-guest-suite \
    -p nas-cg --bin cg
BINDIR=${CARGO_TARGET_DIR:-$ROOT/target}/$TARGET/$PROFILE

# A boot KIND:N as the QEMU device of each NIC, in PCI slot order (one
# word each): KIND N times, or for mixed tulip and e1000e alternating.
nic_devices() {
    local kind=${1%%:*} n=${1#*:} i
    for i in $(seq 0 $((n - 1))); do
        case "$kind" in
            mixed) if [ $((i % 2)) = 0 ]; then echo tulip; else echo e1000e; fi ;;
            *) echo "$kind" ;;
        esac
    done
}
# The NICs of a boot counted by kind, as the guest writes them
# (`tulip:1,e1000e:1`: tulip first, kinds with none left out).
kind_counts() {
    local devs t e
    devs=$(nic_devices "$1")
    t=$(grep -cx tulip <<< "$devs" || true)
    e=$(grep -cx e1000e <<< "$devs" || true)
    { [ "$t" = 0 ] || echo "tulip:$t"; [ "$e" = 0 ] || echo "e1000e:$e"; } | paste -sd, -
}

# The checks each boot plans; an --only that matches none fails here.
for b in "${BOOTS[@]}"; do
    planned=$("$BINDIR/via-guest-suite" plan "$(kind_counts "$b")" "$ONLY") || die "--only $ONLY: unknown check (above)"
    echo "qemu/run.sh: ${b#*:} ${b%%:*} NICs: $(echo "$planned" | wc -l) checks to run besides the NIC count${ONLY:+ (--only $ONLY)}"
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

# 3. Boot, once per --boot.
SILENCE=${VIA_QEMU_SILENCE:-120}
# The suite's first line: silence before it is the boot phase, after it a hang.
SUITE_STARTED='^guest: suite started'
RESULT='^guest: [0-9]+ passed, [0-9]+ failed, [0-9]+ planned$'
# The suite's count of the NICs bound: how many, and by kind.
BOUND='^guest: [0-9]+ NICs bound to vfio-pci \([a-z0-9:,]+\)'
# boot KIND:N LOG: one guest run; returns 0 if the guest printed its result,
# 3 if it fell silent in the boot phase, 4 if it fell silent after the
# suite started (state saved in LOG either way), 6 if QEMU itself died by
# a signal of its own (SIGSEGV, SIGBUS, SIGABRT: QEMU_SIGNAL says which),
# 1 otherwise.
boot() {
    local b=$1 log=$2 mon=$WORK/monitor i=0 dev
    local args=(-accel tcg -machine q35 -cpu max -smp 2 -m 1024 -device intel-iommu
          -kernel "$KERNEL" -initrd "$WORK/initrd.gz"
          -append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=3 printk.devkmsg=on printk.time=0 via_nics=${b#*:} via_kinds=$(kind_counts "$b") via_only=$ONLY$ENVS"
          -nographic -no-reboot -nodefaults -serial stdio -monitor "pipe:$mon")
    # Every NIC on hub 0, whatever its kind; MACs 52:54:00:00:00:01, :02, ...
    for dev in $(nic_devices "$b"); do
        args+=(-netdev "hubport,id=p$i,hubid=0" -device "$dev,netdev=p$i,mac=52:54:00:00:00:$(printf %02x $((i + 1)))")
        i=$((i + 1))
    done
    # VIA_QEMU_ARGS: more QEMU arguments (a TCG plugin, say), split on spaces.
    # shellcheck disable=SC2206
    [ -z "${VIA_QEMU_ARGS:-}" ] || args+=($VIA_QEMU_ARGS)
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
            printf 'info status\ninfo cpus\ninfo pic\ninfo irq\ncpu 0\ninfo lapic\ncpu 1\ninfo lapic\ninfo registers -a\n' > "$mon.in"
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
    local qemu_rc=${PIPESTATUS[0]}
    set -e
    kill "$watchdog" "$reader" 2>/dev/null; wait "$watchdog" "$reader" 2>/dev/null || true
    if [ -e "$WORK/silent" ] || [ -e "$WORK/hung" ]; then
        cat "$log.silent"; cat "$log.silent" >> "$log"
        local cpus halted in_service
        cpus=$(grep -c '^monitor: CPU#' "$log.silent" || true)
        halted=$(grep -c '^monitor: RIP=.* HLT=1' "$log.silent" || true)
        # `info lapic`: "ISR 236" is an interrupt (236: the local timer's)
        # the vCPU entered and never ended; "ISR (none)" when none is.
        in_service=$(grep -cE '^monitor: ISR[[:space:]]+[0-9]' "$log.silent" || true)
        rm -f "$log.silent"
        if [ -e "$WORK/hung" ]; then
            # The guest kernel stopped: every vCPU idle in HLT (nothing ran
            # for SILENCE s, not even the suite's 20 ms poll of its children
            # or its own watchdog, which speaks after 110 s of one check), or
            # a vCPU left with an interrupt in service, whose timers then
            # never fire. Not a hang of ours: our code runs in user space.
            if [ "$cpus" -gt 0 ] && { [ "$halted" = "$cpus" ] || [ "$in_service" -gt 0 ]; }; then
                return 5
            fi
            return 4
        fi
        return 3
    fi
    grep -qaE "$RESULT" "$log" && return 0
    # 128 + the signal: QEMU's own crash (seen once in CI on 2026-12-07:
    # QEMU 7.2 died of SIGSEGV in the middle of a guest's suite, and the
    # same suite passed when booted again). Not our watchdog's SIGKILL
    # (137) nor timeout's SIGTERM (124/143).
    case "$qemu_rc" in
        134|135|139) QEMU_SIGNAL=$((qemu_rc - 128)); return 6 ;;
    esac
    return 1
}

status=0
# Boots passed and failed, by KIND of --boot (the run's last lines).
declare -A PASSED FAILED
KINDS=()
for b in "${BOOTS[@]}"; do
    kind=${b%%:*} n=${b#*:}
    # The label of this boot's lines: "2 e1000e NICs".
    what="$n $kind NICs"
    given=$(kind_counts "$b")
    log=$WORK/guest-$kind-$n.log
    for attempt in 1 2; do
        echo "qemu/run.sh: booting a guest with $what ($given; time limit ${TIMEOUT}s, attempt $attempt)"
        t0=$(date +%s)
        rc=0; boot "$b" "$log" || rc=$?
        t1=$(date +%s)
        [ -n "${VIA_QEMU_LOGDIR:-}" ] && cp "$log" "$VIA_QEMU_LOGDIR/guest-$kind-$n-attempt$attempt.log"
        if [ "$rc" = 3 ] && [ "$attempt" = 1 ]; then
            echo "qemu/run.sh: $what: the guest stopped before the suite started (silent for ${SILENCE} s after $((t1 - t0)) s; state above); booting it again"
            continue
        fi
        # QEMU gone before the suite's first line, with nothing said (the
        # guest's init powers off after the suite, so its last lines can be
        # lost with it): a boot that died, as a silent one, booted again.
        if [ "$rc" = 1 ] && [ "$attempt" = 1 ] && ! grep -qaE "$SUITE_STARTED" "$log"; then
            echo "qemu/run.sh: $what: the guest ended before the suite started (after $((t1 - t0)) s, with no result); booting it again"
            continue
        fi
        if [ "$rc" = 6 ] && [ "$attempt" = 1 ]; then
            echo "qemu/run.sh: $what: QEMU itself died (signal $QEMU_SIGNAL) after $((t1 - t0)) s, the guest's suite unfinished: not the guest's failure; booting it again"
            continue
        fi
        if [ "$rc" = 5 ] && [ "$attempt" = 1 ]; then
            echo "qemu/run.sh: $what: the guest kernel stopped in the suite (every vCPU halted, or one left inside an interrupt; silent for ${SILENCE} s after $((t1 - t0)) s: state above); booting it again"
            continue
        fi
        break
    done
    result=$(grep -aE "$RESULT" "$log" | tail -n 1 || true)
    # "guest: 2 NICs bound to vfio-pci (tulip:1,e1000e:1), ...": 2 and tulip:1,e1000e:1.
    read -r bound bound_kinds < <(grep -aoE "$BOUND" "$log" | tail -n 1 | sed -E 's/^guest: ([0-9]+) .*\((.*)\)$/\1 \2/') || true
    read -r passed failed planned < <(echo "$result" | awk '{print $2, $4, $6}')
    took="$((t1 - t0)) s (attempt $attempt)"
    ok=0
    if [ "$rc" = 3 ]; then
        echo "qemu/run.sh: $what: FAIL: the guest stopped again before the suite started (silent for ${SILENCE} s; state above)"
    elif [ "$rc" = 6 ]; then
        echo "qemu/run.sh: $what: FAIL: QEMU itself died (signal $QEMU_SIGNAL) twice, $took"
    elif [ "$rc" = 5 ]; then
        echo "qemu/run.sh: $what: FAIL: the guest kernel stopped in the suite twice (silent for ${SILENCE} s; state above)"
    elif [ "$rc" = 4 ]; then
        echo "qemu/run.sh: $what: FAIL: the guest hung in the suite (silent for ${SILENCE} s after it started with a vCPU busy, $took; state above; not retried)"
    elif [ -z "$result" ]; then
        echo "qemu/run.sh: $what: FAIL: no result from the guest after $took (crash or time-out)"
    elif [ "${bound:-}" != "$n" ] || [ "${bound_kinds:-}" != "$given" ]; then
        echo "qemu/run.sh: $what: FAIL: ${bound:-no count of} NICs bound to vfio-pci (${bound_kinds:-none}), $n given ($given); $result, $took"
    elif [ "$planned" = 0 ] || [ "$passed" != "$planned" ] || [ "$failed" != 0 ]; then
        echo "qemu/run.sh: $what: FAIL: $bound bound; $result (every planned check must pass, and some be planned), $took"
    elif ! grep -q '^GUEST-EXIT 0' "$log"; then
        echo "qemu/run.sh: $what: FAIL: $result but the guest exited non-zero ($(grep -a '^GUEST-EXIT' "$log" | tail -n 1)), $took"
    else
        echo "qemu/run.sh: $what: $bound bound; $result in $took"
        ok=1
    fi
    [ -n "${PASSED[$kind]:-}" ] || { KINDS+=("$kind"); PASSED[$kind]=0; FAILED[$kind]=0; }
    if [ "$ok" = 1 ]; then
        PASSED[$kind]=$((PASSED[$kind] + 1))
    else
        FAILED[$kind]=$((FAILED[$kind] + 1))
        status=1
    fi
done
for kind in "${KINDS[@]}"; do
    echo "qemu/run.sh: $kind: ${PASSED[$kind]} passed, ${FAILED[$kind]} failed (boots)"
done
exit $status
