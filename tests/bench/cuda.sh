#!/bin/sh
# The CUDA backend on a GPU machine: build (make cuda), kernel tests against
# the CPU reference, model references through --backend cuda, then anebench
# on real-size synthetic models (llama.cpp anchors in docs/benchmarks-cuda.md).
#   sh tests/bench/cuda.sh [build|test|bench|all] [MODEL:TYPE ...]
# Where the Debian libraries are missing, .debs/*.deb (apt-get download of
# libmsgpack-dev libmsgpackc2 libev-dev libev4 libjansson-dev libjansson4
# libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2) are unpacked into a
# private prefix. A prebuilt bin/obj-cuda/shaders/*.o in .prebuilt/ is reused.
cd "$(dirname "$0")/../.."
what=${1:-all}; [ $# -gt 0 ] && shift
MODELS=${*:-"qwen2.5-0.5b:q8_0 qwen2.5-7b:q4_k qwen2.5-7b:q8_0"}
PY=${PYTHON:-python3}
J=$(nproc)
set --
if ls .debs/*.deb >/dev/null 2>&1; then
    PFX=/tmp/anepfx; L=$PFX/usr/lib/x86_64-linux-gnu
    mkdir -p $PFX; for f in .debs/*.deb; do dpkg -x "$f" $PFX; done
    export LD_LIBRARY_PATH=$L:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
    mkdir -p bin; touch bin/.deps-ok
    set -- SKIP_DEPS=1 "PC_CFLAGS=-I$PFX/usr/include -DUTF8PROC_EXPORTS" \
           "PC_LIBS=-L$L -lmsgpackc -ljansson -lpcre2-8 -lutf8proc" "LDFLAGS=-L$L -pthread"
fi
if [ -d .prebuilt ]; then
    mkdir -p bin/obj-cuda/shaders && cp .prebuilt/*.o bin/obj-cuda/shaders/ && touch bin/obj-cuda/shaders/*.o
fi
t0=$(date +%s)
make -j"$J" CUDA=1 "$@" all >/tmp/build.log 2>&1 || { tail -40 /tmp/build.log; exit 1; }
echo "== build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
rc=0
if [ "$what" = test ] || [ "$what" = all ]; then
    echo "== t_backend"; bin/tests/t_backend || rc=1
    echo "== t_models (--backend cuda)"; ANE_BACKEND=cuda bin/tests/t_models || rc=1
    echo "== t_engine (default backend: cuda)"
    bin/tests/t_engine > /tmp/t_engine.log 2>&1 || rc=1
    grep -E "FAIL|failed" /tmp/t_engine.log | tail -20
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    for m in $MODELS; do
        p=${m%%:*}; t=${m##*:}; f=/tmp/$p-$t.gguf
        [ -f "$f" ] || $PY tests/bench/synth_gguf.py --preset "$p" --type "$t" \
            --template tests/fixtures/models/qwen2-tiny.bf16.gguf -o "$f" >/dev/null || { rc=1; continue; }
        echo "== $p $t: prompt 512, gen 128, 32 streams"
        bin/anebench --model "$f" --backend cuda --prompt 512 --gen 128 --streams 32 --repeat ${BENCH_REPEAT:-2} || rc=1
    done
fi
exit $rc
