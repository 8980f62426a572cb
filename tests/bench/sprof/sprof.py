#!/usr/bin/env python3
"""Time per function from sprof.so's samples (sprof.c says how to take them).

usage: sprof.py FILE [N]   the N (default 40) functions with the most samples.
Addresses are mapped to the symbol below them (nm), so an inlined function's
time is its caller's."""
import bisect
import collections
import subprocess
import sys


def symbols(path):
    """sorted (address, name) of an object's functions"""
    out = []
    for flags in (["--defined-only", "-n"], ["-D", "--defined-only", "-n"]):
        try:
            p = subprocess.run(["nm"] + flags + [path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return []
        for line in p.stdout.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "tTwWiI":
                out.append((int(f[0], 16), f[2]))
        if out:
            break
    out.sort()
    return out


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    per = collections.Counter()
    objs = {}
    total = 0
    for line in open(sys.argv[1]):
        c, off, path = line.split(None, 2)
        c, off, path = int(c), int(off, 16), path.strip()
        total += c
        if path not in objs:
            objs[path] = symbols(path) if path != "?" else []
        syms = objs[path]
        i = bisect.bisect_right(syms, (off, "\uffff")) - 1
        name = syms[i][1] if i >= 0 else "?"
        per["%s (%s)" % (name, path.rsplit("/", 1)[-1])] += c
    print("%d samples (each a thread's millisecond)" % total)
    for name, c in per.most_common(top):
        print("%6.2f%%  %7d  %s" % (100.0 * c / total, c, name))


if __name__ == "__main__":
    main()
