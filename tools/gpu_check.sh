#!/usr/bin/env bash
# The GPU check: one call of about 6.5 minutes at most on a bare GPU machine (one H100 or
# H200, Python 3.12 with PyTorch and transformers, no Monarch, no package registry, no
# network). From the repository root:
#
#   tools/gpu_check.sh OUT_DIR [--model CHECKPOINT_DIR]
#
# Parts, each under its own time limit, each recorded as passed, failed or timed out while
# the others still run (docs/gpu_check.md says what each measures):
#   setup        unpacks .offline/ (Monarch, carried wheels) into a folder on PYTHONPATH with
#                the workspace's src folders; imports everything; spawns one Monarch actor
#   gpu_tests    pytest -m gpu over every member's tests (the files that mark tests gpu)
#   weight_sync  packages/rdma-tensor/benchmarks/gpu_weight_sync.py: a Qwen2.5-0.5B-shaped
#                bf16 state dict, CUDA trainer process -> CUDA generator process
#   app          async-grpo --preset qwen2.5-0.5b --model.random_weights true (or --model
#                CHECKPOINT_DIR) with the HF engine for about 3 minutes, 1 of them training
#                (the reference model on the trainer's GPU), a checkpoint every 20 steps, GPU
#                memory sampled
# and one part that runs only when GPU_CHECK_PARTS names it:
#   async_vs_sync  apps/async_grpo/benchmarks/async_vs_sync.py --device cpu --steps 300: the
#                tiny preset's two modes on the machine's CPU cores, each process on a core
#                of its own, then confined to 2 of them (the development machine's count)
# Then OUT_DIR/gpu_check.json (everything), OUT_DIR/<part>.log (each part's log, its last
# 400 lines) and a short table. Exits 1 if any part failed or timed out.
#
# Without a CUDA device (the rehearsal, `uv run nox -s gpu_rehearsal`) the same script runs
# everything it can on the CPU, clearly labelled: the gpu tests are collected and skip,
# the weight sync uses a tiny state dict, and the app runs the same preset with the model
# shrunk to the tiny architecture for 3 steps.
#
# Before the device call, here: tools/gpu_bundle.sh (builds .offline/, about 41 MiB). The
# device call: the part limits add up to 375 s and `timeout` kills a part at most 5 s past
# its limit, so the script ends within about 6.5 minutes; timeout_s=430 only keeps the call
# from cutting off the summary:
#
#   run(command='bash tools/gpu_check.sh "$OUT"', carry=[".offline"], timeout_s=430)
#
# What comes back in $OUT: gpu_check.json, <part>.log for each part run, app_metrics.jsonl.
# docs/gpu_check.md describes it all and keeps the results.
#
# Settings (environment): GPU_CHECK_PYTHON (python3), GPU_CHECK_WORK (scratch, default
# /tmp/gpu_check: the app's checkpoints are large, so they stay out of OUT_DIR), and the
# part limits in seconds GPU_CHECK_SETUP_S (35), GPU_CHECK_TESTS_S (70), GPU_CHECK_SYNC_S
# (60), GPU_CHECK_APP_S (210), GPU_CHECK_APP_TRAIN_S (60: the app's --max_minutes) and
# GPU_CHECK_BENCH_S (240: async_vs_sync); GPU_CHECK_APP_ARGS, more options for the app
# (after the script's own); GPU_CHECK_PARTS, the parts to run (default "setup gpu_tests
# weight_sync app"; the others are "not run", and setup is needed by the rest).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
PY=${GPU_CHECK_PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
SITE=$WORK/site
SRC=
for dir in "$root"/packages/*/src "$root"/apps/*/src; do SRC=${SRC:+$SRC:}$dir; done
export PYTHONPATH=$SITE:$SRC PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 # the same plugins here and in the rehearsal
export PY WORK SITE root

# ------------------------------------------------------------------ the parts (subcommands)

part_setup() {
    "$PY" -c 'import sys; v = sys.version_info; print("python", sys.version.split()[0]); sys.exit(v[:2] != (3, 12) and "the Monarch bundle is for CPython 3.12")' || return 1
    [ -f "$root/.offline/monarch-cp312.tar.xz" ] || { echo ".offline/ is missing: run tools/gpu_bundle.sh here, then carry .offline"; return 1; }
    rm -rf "$SITE" && mkdir -p "$SITE" || return 1
    # Python unpacks it: the machine's image may lack the xz program.
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
        "$root/.offline/monarch-cp312.tar.xz" "$SITE" || return 1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        "$root"/.offline/wheels/*.whl || return 1
    echo "unpacked into $SITE: $(cd "$SITE" && echo *)"
    if command -v nvidia-smi > /dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    # Weight sync stages in shared memory (two slots of 1.26 GB for the 0.5B model), pinned.
    df -h /dev/shm "$WORK" | sed 's/^/  /'
    echo "  max locked memory: $(ulimit -l)"
    "$PY" "$root/tools/gpu_check.py" environment --json "$WORK/environment.json" --site "$SITE"
}

part_gpu_tests() {
    local rc=0 dir files name
    cd "$root" || return 1
    for dir in packages/*/tests apps/*/tests; do
        # Only the files that mark a test gpu: the others may import what this machine
        # lacks (plotly, Playwright), and their tests would be deselected anyway.
        files=$(grep -rlE --include='test_*.py' 'mark\.gpu|pytestmark.*gpu' "$dir" | sort)
        if [ -z "$files" ]; then echo "$dir: no gpu-marked tests"; continue; fi
        name=$(basename "$(dirname "$dir")")
        echo "== $dir: $(echo "$files" | wc -l) file(s)"
        # shellcheck disable=SC2086
        "$PY" -m pytest -c pyproject.toml --rootdir . -p pytest_asyncio.plugin -p pytest_timeout \
            -p no:cacheprovider -m gpu --timeout 120 -rA --junitxml "$WORK/junit-$name.xml" \
            $files
        case $? in
        0 | 5) ;; # 5: nothing left to run (a module skipped whole, e.g. without vLLM)
        *) rc=1 ;;
        esac
    done
    return $rc
}

part_weight_sync() {
    cd "$root" && "$PY" packages/rdma-tensor/benchmarks/gpu_weight_sync.py --json "$WORK/weight_sync.json"
}

part_app() {
    # Checkpoints more often than the preset's 100 steps, so that one run writes several
    # through the same trainer (torch 2.11's stager once served only the first).
    local args=(--generator.engine hf --out_dir "$WORK/app" --log_every 5)
    if [ "$(cat "$WORK/mode")" = cuda ]; then
        local minutes
        minutes=$(awk -v s="${GPU_CHECK_APP_TRAIN_S:-60}" 'BEGIN { printf "%.3f", s / 60 }')
        # The preset as written (KL on: the reference model shares the trainer's GPU).
        args+=(--preset qwen2.5-0.5b --steps 1000000 --max_minutes "$minutes" --checkpoint.every 20)
        echo "[one GPU: the qwen2.5-0.5b preset, ${GPU_CHECK_APP_TRAIN_S:-60} s of training]" > "$WORK/app.label"
    else
        # KL off on the CPU: the reference model's forward would hold every step there.
        args+=(--preset qwen2.5-0.5b --device cpu --model.arch tiny --steps 3 --trainer.loss.kl_coef 0 --checkpoint.every 1)
        echo "[CPU rehearsal: the qwen2.5-0.5b preset on the CPU, KL off, the model shrunk to tiny]" > "$WORK/app.label"
    fi
    if [ -n "${MODEL_DIR:-}" ]; then args+=(--model "$MODEL_DIR"); else args+=(--model.random_weights true); fi
    # shellcheck disable=SC2206
    args+=(${GPU_CHECK_APP_ARGS:-})
    rm -rf "$WORK/app" && mkdir -p "$WORK/app"
    echo "$PY -m async_grpo.cli ${args[*]}" | tee "$WORK/app.command"
    "$PY" "$root/tools/gpu_check.py" sample-memory --out "$WORK/memory.jsonl" \
        --processes "$WORK/app/processes.json" &
    local sampler=$!
    "$PY" -m async_grpo.cli "${args[@]}" &
    local app=$!
    echo "$app" > "$WORK/app/controller.pid"
    wait "$app"
    local rc=$?
    kill "$sampler" 2> /dev/null
    wait "$sampler" 2> /dev/null
    return $rc
}

part_async_vs_sync() {
    # 300 steps a mode on a GPU machine's cores, then again with the run confined to two of
    # them (the development machine's count, on the same CPUs); the CPU rehearsal's 30 only
    # show that it runs offline. Python sets the affinity: the image may lack taskset.
    local steps=300
    [ "$(cat "$WORK/mode")" = cuda ] || steps=30
    local bench=(apps/async_grpo/benchmarks/async_vs_sync.py --device cpu --steps "$steps")
    cd "$root" || return 1
    "$PY" "${bench[@]}" --json "$WORK/async_vs_sync.json" || return 1
    echo
    "$PY" -c 'import os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
os.execvp(sys.argv[1], sys.argv[1:])' "$PY" "${bench[@]}" --json "$WORK/async_vs_sync_2cpus.json"
}

if [ "${1:-}" = --part ]; then
    "part_$2"
    exit $?
fi

# ------------------------------------------------------------------ the run

usage() { echo "usage: tools/gpu_check.sh OUT_DIR [--model CHECKPOINT_DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1
shift
MODEL_DIR=
while [ $# -gt 0 ]; do
    case $1 in
    --model) [ $# -ge 2 ] || usage; MODEL_DIR=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    *) usage ;;
    esac
done
export MODEL_DIR
# Checked before the scratch directory is emptied: a mistyped list loses no earlier run.
DEFAULT_PARTS="setup gpu_tests weight_sync app"
ALL_PARTS="$DEFAULT_PARTS async_vs_sync"
for part in ${GPU_CHECK_PARTS:-$DEFAULT_PARTS}; do
    [[ " $ALL_PARTS " == *" $part "* ]] || { echo "GPU_CHECK_PARTS: no part '$part' (the parts: $ALL_PARTS)" >&2; exit 2; }
done
# The other parts import what setup installs: without it they fail in a second, and the
# device time of the machine's start is spent for nothing.
[[ " ${GPU_CHECK_PARTS:-$DEFAULT_PARTS} " == *" setup "* ]] || { echo "GPU_CHECK_PARTS: '${GPU_CHECK_PARTS}' has no setup, which installs what the other parts import; add it" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
rm -rf "$WORK" && mkdir -p "$WORK" || exit 2
date +%s.%N > "$WORK/started_unix"
date +%Y-%m-%dT%H:%M:%S%z > "$WORK/started"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    echo cuda > "$WORK/mode"
else
    echo cpu > "$WORK/mode"
fi
echo "gpu_check: mode $(cat "$WORK/mode"), python $(command -v "$PY"), scratch $WORK, results $OUT"

# Starts a command as the leader of a new session, writing its pid (= the session id) to
# $1 (Python's os.setsid: the image may lack the setsid program).
NEW_SESSION='import os, sys
os.setsid()
open(sys.argv[1], "w").write(str(os.getpid()))
os.execvp(sys.argv[2], sys.argv[2:])'

# The pids of the processes in session $1, read from /proc (the image may lack ps).
in_session() {
    local wanted=$1 stat rest p
    for p in /proc/[0-9]*; do
        read -r stat < "$p/stat" 2> /dev/null || continue
        rest=${stat##*) } # after the command name, which may hold spaces
        # shellcheck disable=SC2086
        set -- $rest # state ppid pgrp session ...
        [ "${4:-}" = "$wanted" ] && [ "$1" != Z ] && echo "${p#/proc/}" # not zombies
    done
}

# Runs one part in a session of its own under `timeout`, streams its log, then ends every
# process still in that session (Monarch's processes each lead a process group of their
# own, so killing the group alone would leave them holding the GPU).
run_part() {
    local name=$1 limit=$2 log=$WORK/$1.full.log start rc sid
    start=$(date +%s.%N)
    echo
    echo "======== $name (at most ${limit} s)"
    : > "$log"
    "$PY" -c "$NEW_SESSION" "$WORK/$name.sid" \
        timeout -k 5 "$limit" bash "$root/tools/gpu_check.sh" --part "$name" > "$log" 2>&1 < /dev/null &
    local pid=$!
    tail -n +1 -f --pid="$pid" "$log" &
    local tailer=$!
    wait "$pid"
    rc=$?
    wait "$tailer" 2> /dev/null
    sid=$(cat "$WORK/$name.sid" 2> /dev/null)
    if [ -n "$sid" ]; then
        local left
        left=$(in_session "$sid")
        if [ -n "$left" ]; then
            echo "[$name: ending $(echo "$left" | wc -w) process(es) it left running]"
            # shellcheck disable=SC2086
            kill -9 $left 2> /dev/null
        fi
    fi
    local seconds status reason=""
    seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    case $rc in
    0) status=passed ;;
    124 | 137) status=timed_out; reason="stopped at its ${limit} s limit" ;;
    *) status=failed; reason="exit status $rc" ;;
    esac
    tail -n 400 "$log" > "$OUT/$name.log"
    printf '{"status": "%s", "seconds": %s, "limit_s": %s, "exit_status": %s, "reason": "%s"}\n' \
        "$status" "$seconds" "$limit" "$rc" "$reason" > "$WORK/$name.status.json"
    echo "======== $name: $status after ${seconds} s${reason:+ ($reason)}"
}

wanted() { [[ " ${GPU_CHECK_PARTS:-$DEFAULT_PARTS} " == *" $1 "* ]]; }
wanted setup && run_part setup "${GPU_CHECK_SETUP_S:-35}"
wanted gpu_tests && run_part gpu_tests "${GPU_CHECK_TESTS_S:-70}"
wanted weight_sync && run_part weight_sync "${GPU_CHECK_SYNC_S:-60}"
wanted app && run_part app "${GPU_CHECK_APP_S:-210}"
wanted async_vs_sync && run_part async_vs_sync "${GPU_CHECK_BENCH_S:-240}"
cp "$WORK/app/metrics.jsonl" "$OUT/app_metrics.jsonl" 2> /dev/null
"$PY" "$root/tools/gpu_check.py" summarize "$WORK" "$OUT"
