#!/bin/sh
# Runs every unit test program (bin/tests/t_*) and every integration test
# (tests/integration/*.sh, *.py), adds up their "N passed, M failed" lines and
# closes with the total. A program that ends without such a line, or exits
# non-zero, counts as one failure.
PYTHON=${PYTHON:-/usr/bin/python3}
export PYTHON
cd "$(dirname "$0")/.." || exit 1
tp=0; tf=0
log=$(mktemp -d /tmp/anetest.XXXXXX)
run_one() {
    name=$1; shift
    out="$log/$(basename "$name").out"
    if [ -n "$ANE_TEST_TIMEOUT" ]; then to=$ANE_TEST_TIMEOUT; else to=600; fi
    timeout "$to" "$@" </dev/null >"$out" 2>&1; rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    if [ -n "$line" ]; then
        p=${line%% passed*}; f=${line#*passed, }; f=${f%% failed*}
    else
        p=0; f=0
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ -z "$line" ] && [ "$rc" -eq 0 ]; then f=1; fi
    tp=$((tp + p)); tf=$((tf + f))
    if [ "$f" -ne 0 ]; then
        printf '%-44s FAIL (%s passed, %s failed, exit %s)\n' "$name" "$p" "$f" "$rc"
        sed 's/^/    | /' "$out" | tail -n 40
    else
        printf '%-44s ok (%s passed)\n' "$name" "$p"
    fi
}
for t in bin/tests/t_*; do
    [ -x "$t" ] || continue
    run_one "$t" "$t"
done
# The aarch64 builds (make aarch64) of the quant tests: the NEON kernels,
# under qemu-user. Where they could not be built, a notice and no count.
aa_qemu=${AA_QEMU:-qemu-aarch64-static}
aa_n=0
for t in bin/aarch64/t_*; do
    [ -x "$t" ] || continue
    command -v "$aa_qemu" >/dev/null 2>&1 || break
    run_one "$t (qemu)" "$aa_qemu" "$t"
    aa_n=$((aa_n + 1))
done
[ "$aa_n" -gt 0 ] || echo "bin/aarch64 (NEON kernels under qemu)           skipped: not built (make aarch64 says why)"
for t in tests/integration/*.sh; do
    [ -f "$t" ] || continue
    run_one "$t" sh "$t"
done
for t in tests/integration/test_*.py; do
    [ -f "$t" ] || continue
    run_one "$t" "$PYTHON" "$t"
done
rm -rf "$log"
echo "$tp passed, $tf failed"
[ "$tf" -eq 0 ]
