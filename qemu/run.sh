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
status=0
for n in "${NICS[@]}"; do
    args=(-accel tcg -machine q35 -cpu max -smp 2 -m 1024 -device intel-iommu
          -kernel "$KERNEL" -initrd "$WORK/initrd.gz"
          -append "console=ttyS0 intel_iommu=on panic=-1 quiet loglevel=3 via_only=$ONLY$ENVS"
          -nographic -no-reboot -nodefaults -serial stdio)
    for i in $(seq 0 $((n - 1))); do
        args+=(-netdev "hubport,id=p$i,hubid=0" -device "tulip,netdev=p$i,mac=52:54:00:00:00:$(printf %02x $((i + 1)))")
    done
    log=$WORK/guest-$n.log
    echo "qemu/run.sh: booting a guest with $n tulip NICs (time limit ${TIMEOUT}s)"
    t0=$(date +%s)
    set +e
    timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 "${args[@]}" </dev/null 2>&1 | sed -u 's/\r$//' | tee "$log"
    set -e
    t1=$(date +%s)
    result=$(grep -E '^guest: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
    if [ -z "$result" ]; then
        echo "qemu/run.sh: $n NICs: no result from the guest after $((t1 - t0)) s (crash or time-out)"
        status=1
    elif ! grep -q '^GUEST-EXIT 0' "$log"; then
        echo "qemu/run.sh: $n NICs: $result (failures above), $((t1 - t0)) s"
        status=1
    else
        echo "qemu/run.sh: $n NICs: $result in $((t1 - t0)) s"
    fi
    [ -n "${VIA_QEMU_LOGDIR:-}" ] && cp "$log" "$VIA_QEMU_LOGDIR/"
done
exit $status
