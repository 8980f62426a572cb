#!/bin/sh
# `make run`: starts bin/aned on MODEL with its log in bin/aned-run.log, then
# prints PROMPT and the model's continuation of it (--raw), or, for a model
# whose info reports a chat template (an instruct model), the model's answer
# to PROMPT. The daemon is stopped however this ends: done, failed,
# interrupted, or the output closed early (make run | head).
#
# usage: tests/run_demo.sh MODEL PROMPT [MAX_TOKENS]     (run from the repository root)
me="make run"
model=$1
prompt=$2
max=${3:-200}
log=bin/aned-run.log

if [ -z "$model" ]; then
    echo "$me: MODEL is empty; give MODEL=path/to/model.gguf (or a Hugging Face directory)" >&2
    exit 2
fi
if [ ! -e "$model" ]; then
    echo "$me: MODEL=$model: no such file or directory" >&2
    exit 2
fi
for p in bin/aned bin/aneclient; do
    [ -x "$p" ] || { echo "$me: $p is missing: build first (make)" >&2; exit 1; }
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/aned-run.XXXXXX") || exit 1
sock=$dir/aned.sock
pid=
probe=

stop_daemon() {
    trap - EXIT INT TERM HUP PIPE
    [ -n "$probe" ] && kill "$probe" 2>/dev/null
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$dir"
}
trap stop_daemon EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 0' PIPE      # the reader went away (make run | head): not a failure

bin/aned --model "$model" --socket "$sock" >"$log" 2>&1 &
pid=$!
echo "$me: aned (pid $pid) is loading $model; its log: $log" >&2

# Ready once it answers info (requests wait while the model loads); gone
# means it could not start: its log says why. The probe runs in the
# background so that a signal is acted on at once, not after its time-out.
while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        rc=$?
        pid=
        echo "$me: aned stopped during start-up (exit status $rc); the end of $log:" >&2
        tail -n 5 "$log" | sed 's/^/    /' >&2
        exit 1
    fi
    if [ -S "$sock" ]; then
        bin/aneclient --socket "$sock" --no-stdin --info --json >"$dir/info" 2>/dev/null &
        probe=$!
        wait "$probe" && break
        probe=
    fi
    sleep 0.1
done
probe=
info=$(cat "$dir/info")

template=$(printf '%s\n' "$info" | sed -n 's/.*"chat_template":"\([^"]*\)".*/\1/p')
if [ -n "$template" ] && [ "$template" != none ]; then
    echo "$me: the model has a chat template ($template): its answer to \"$prompt\"" >&2
    bin/aneclient --socket "$sock" --no-stdin -n "$max" "$prompt"
    rc=$?
else
    printf '%s' "$prompt"
    bin/aneclient --socket "$sock" --no-stdin --raw -n "$max" "$prompt"
    rc=$?
fi
[ $rc -eq 141 ] && exit 0    # killed by SIGPIPE: the reader went away
[ -t 1 ] || echo             # a terminal already got its final newline
exit $rc
