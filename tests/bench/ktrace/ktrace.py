#!/usr/bin/env python3
"""One step of a ktrace.so timeline: the kernels by total time, and each
kernel's start, end and length (us from the step's start).

  ktrace.py TRACE [STEP] [ROWS]

TRACE: ktrace.so's file (or .gz). Steps are the runs of kernels between
gaps of over 20 us (a decode step's graph); STEP counts from the end (-3:
the third-last, default). ROWS: how many of the step's kernels to list
(default 40). A kernel's end minus the end of the one before is its share
of the step's critical path."""
import collections, gzip, re, sys

def main():
    path = sys.argv[1]
    pick = int(sys.argv[2]) if len(sys.argv) > 2 else -3
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    op = gzip.open if path.endswith('.gz') else open
    ks = []
    with op(path, 'rt') as f:
        for line in f:
            a = line.split(None, 4)
            ks.append((int(a[0]), int(a[1]), int(a[2]), a[4].strip()))
    ks.sort()
    steps, cur, end = [], [], 0
    for k in ks:
        if cur and k[0] - end > 20000:
            steps.append(cur)
            cur = []
        end = max(end, k[1]) if cur else k[1]
        cur.append(k)
    steps.append(cur)
    s = steps[pick]
    t0 = s[0][0]
    print('%d steps; this one %.1f us, %d kernels' % (len(steps), (max(k[1] for k in s) - t0) / 1e3, len(s)))
    name = lambda n: re.sub(r'\(.*', '', n)[:48]
    tot = collections.defaultdict(lambda: [0, 0.0])
    for k in s:
        tot[name(k[3])][0] += 1
        tot[name(k[3])][1] += (k[1] - k[0]) / 1e3
    for n, (c, us) in sorted(tot.items(), key=lambda x: -x[1][1]):
        print('%-48s %4d  %9.1f us' % (n, c, us))
    print('%9s %9s %7s %7s %6s  kernel' % ('start', 'end', 'length', 'path', 'blocks'))
    prev = t0
    for k in s[:rows]:
        print('%9.2f %9.2f %7.2f %7.2f %6d  %s' % ((k[0] - t0) / 1e3, (k[1] - t0) / 1e3, (k[1] - k[0]) / 1e3,
                                                 (k[1] - prev) / 1e3, k[2], name(k[3])))
        prev = max(prev, k[1])

if __name__ == '__main__':
    main()
