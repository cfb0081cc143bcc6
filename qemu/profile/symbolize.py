#!/usr/bin/env python3
"""Guest instructions per function of a static, non-PIE guest binary.

Usage: symbolize.py BINARY COUNTS [TOP]

COUNTS is what qemu/profile/tbcount.c wrote (vaddr insns execs per block).
Blocks inside BINARY's text are charged to the function (nm) they start
in; the rest is summed as "kernel" (upper half) or "elsewhere" (other
user code: the boot's decompressor, busybox, the vDSO). Prints the sums,
then the TOP functions (default 30).
"""
import bisect
import collections
import subprocess
import sys


def functions(binary):
    out = subprocess.run(["nm", "-n", "-C", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16), parts[2]))
    return syms


def main():
    binary, counts = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    syms = functions(binary)
    starts = [a for a, _ in syms]
    lo, hi = starts[0], starts[-1] + 0x10000
    per_function = collections.Counter()
    where = collections.Counter()
    for line in open(counts):
        vaddr, insns, execs = line.split()
        vaddr, n = int(vaddr, 16), int(insns) * int(execs)
        if vaddr >= 0xFFFF800000000000:
            where["kernel"] += n
        elif lo <= vaddr < hi:
            where["binary"] += n
            per_function[syms[bisect.bisect_right(starts, vaddr) - 1][1][:120]] += n
        else:
            where["elsewhere"] += n
    print(", ".join(f"{k} {v:,}" for k, v in where.most_common()))
    for name, n in per_function.most_common(top):
        print(f"{n:>14,} {name}")


if __name__ == "__main__":
    main()
