#!/bin/sh
# make bench: engine speed on real-size synthetic models (random weights with
# the shapes of published models; speed does not depend on the values).
# Models are written once into bin/models/ by synth_gguf.py.
#   BENCH_THREADS (default 2), BENCH_REPEAT (default 3), BENCH_MODELS to pick.
set -e
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
T=${BENCH_THREADS:-2}
R=${BENCH_REPEAT:-3}
mkdir -p bin/models
synth() { # preset type template
    out=bin/models/$1-$2.gguf
    if [ ! -f "$out" ]; then
        echo "writing $out ..." >&2
        $PY tests/bench/synth_gguf.py --preset "$1" --type "$2" --template "$3" -o "$out.tmp" >/dev/null
        mv "$out.tmp" "$out"
    fi
    echo "$out"
}
Q2=tests/fixtures/models/qwen2-tiny.bf16.gguf
MODELS=${BENCH_MODELS:-"qwen2.5-0.5b:q8_0 qwen2.5-1.5b:q4_k"}
for m in $MODELS; do
    f=$(synth "${m%%:*}" "${m##*:}" "$Q2")
    echo "== $f (prompt 128, gen 64, $T threads)"
    bin/anebench --model "$f" --prompt 128 --gen 64 --threads "$T" --repeat "$R"
done
if [ -z "$BENCH_MODELS" ]; then
    f=$(synth qwen2.5-0.5b q4_0 "$Q2")
    echo "== $f: 8 concurrent greedy streams vs one"
    bin/anebench --model "$f" --prompt 32 --gen 64 --threads "$T" --streams 8 --repeat "$R"
fi
echo "== aned-http: what the HTTP gateway adds to libaneclient (stories260K)"
bin/httpbench --repeat "$((R * 5))"
