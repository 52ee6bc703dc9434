#!/usr/bin/env bash
# Issue 10: every GPU measurement in ONE command of at most 10 minutes, on a bare GPU machine with a cold compile
# cache; everything it writes lands in one archive, beside a summary and a log.
#
#   bash benchmarks/gpu_suite.sh [--data DIR] [--out DIR]    # on a machine with a CUDA GPU (PYTHON=... to choose)
#   bash benchmarks/gpu_suite.sh --cpu-smoke [--out DIR]     # every stage at a toy size on the CPU
#
# The output folder ($OUT if set, else --out, else benchmarks/results/gpu-<UTC stamp>/, cpu-smoke-<stamp>/) ends up
# holding exactly three files (a remote run brings back at most eight):
#   <gpu-suite|cpu-smoke>-<stamp>.tar.gz   every stage's JSON, logs/<stage>.log, stages.jsonl, env.json, summary.json
#   summary.json                           stages, headline figures, targets, and the figures still unmeasured
#   suite.log                              what the suite printed, with the last lines of each stage that failed
#
# Stages, in order of value, each under its own time budget (seconds; SUITE_BUDGET_<STAGE> overrides), all within
# SUITE_TOTAL_S (default 540 s: the summary and the archive fit in the rest of 10 minutes). A stage that fails or
# runs out of time is recorded and the suite goes on; a stage that finds too little time left is recorded as
# skipped. Every measuring stage rewrites its JSON after each part, so one cut short keeps what it measured.
# Compiled stages fall back to eager when compilation fails, and their JSON says so (compile_note).
#   env                    20  GPU, driver, packages, C compiler, inductor cache state    -> env.json
#   te_compiled_bf16      210  tinyelectra, Small 128 x 128, bf16, torch.compile: tokens/s, MFU, compile time, graphs,
#                              graph breaks, recompiles while timing, attention kernel, peak memory, top kernels
#   te_eager_bf16          45  the same, eager (kernel launches per step: how host-bound eager is)
#   hf_eager_bf16          60  transformers' ElectraForMaskedLM + ElectraForPreTraining, eager
#   hf_compiled_bf16      150  the same, torch.compile on both models
#   te_cudagraphs_bf16    150  tinyelectra, train.compile=reduce-overhead (CUDA graphs + graph-safe update)
#   te_compiled_fp16      120  tinyelectra, fp16 (dynamic loss scaling), compiled
#   memory_small           60  benchmarks/memory.py: Small, bf16 and fp32, gradient checkpointing off and on
#   attention              30  benchmarks/attention.py: SDPA kernels at Small's shapes, flash without mask as reference
#   te_compiled_bf16_b256 100  batch sweep (128 is te_compiled_bf16)
#   te_compiled_bf16_b512 100
#   loss_check            150  benchmarks/loss_check.py: eager vs compiled, 20 steps, per-step losses
# SUITE_ONLY=a,b runs only the named stages (e.g. those a first run could not reach); SUITE_GIT_COMMIT names the
# commit where the checkout has no .git. Timing: rounds of 20 steps back to back, one synchronisation per round.
# --cpu-smoke: the tiny recipe (one layer) at toy sizes; compile stages use the aot_eager backend
# (TINYELECTRA_COMPILE_BACKEND), fp16 stages run fp32, CUDA graphs do not exist on a CPU; summary.json says so.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="gpu"
DATA=""
OUT_DIR="${OUT:-}"

usage() { sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        --cpu-smoke) MODE="smoke" ;;
        --data) DATA="${2:?--data needs a directory}"; shift ;;
        --out) OUT_DIR="${2:?--out needs a directory}"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ -n "$DATA" && ! -f "$DATA/manifest.json" ]]; then
    echo "error: --data $DATA: no manifest.json (a directory written by \`tinyelectra prepare\`)" >&2
    exit 2
fi

STAMP="$(date -u +%Y%m%d-%H%M%S)"
if [[ "$MODE" == "smoke" ]]; then NAME="cpu-smoke-$STAMP"; else NAME="gpu-suite-$STAMP"; fi
if [[ -z "$OUT_DIR" ]]; then
    if [[ "$MODE" == "smoke" ]]; then OUT_DIR="$ROOT/benchmarks/results/$NAME"; else OUT_DIR="$ROOT/benchmarks/results/gpu-$STAMP"; fi
fi
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="${SUITE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/tinyelectra-suite.XXXXXX")}"
STAGE_DIR="$WORK/$NAME" # becomes the archive
mkdir -p "$STAGE_DIR/logs" || exit 2
STAGES="$STAGE_DIR/stages.jsonl"
: >"$STAGES"
LOG="$OUT_DIR/suite.log"
: >"$LOG"

PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cd "$ROOT" || exit 2

TOTAL_S="${SUITE_TOTAL_S:-540}"
SUMMARY_RESERVE_S=10 # kept for the summary and the archive
MIN_STAGE_S=10       # a stage with less time left than this is skipped
START_S="$(date +%s)"
DEADLINE_S=$((START_S + TOTAL_S))
STAGE_PID=""
FINISHED=""

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

json_str() { # a bash string as a JSON string
    local s="$1"
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="${s//$'\t'/\\t}"
    s="${s//$'\n'/\\n}"
    s="${s//$'\r'/}"
    printf '"%s"' "$s"
}

record() { # NAME STATUS RC SECONDS BUDGET NOTE COMMAND...
    local name="$1" status="$2" rc="$3" seconds="$4" budget="$5" note="$6" log=""
    shift 6
    [[ -f "$STAGE_DIR/logs/$name.log" ]] && log="logs/$name.log"
    printf '{"stage": %s, "status": %s, "rc": %s, "seconds": %s, "budget_s": %s, "note": %s, "log": %s, "command": %s}\n' \
        "$(json_str "$name")" "$(json_str "$status")" "$rc" "$seconds" "$budget" "$(json_str "$note")" \
        "$(json_str "$log")" "$(json_str "$*")" >>"$STAGES"
    say "$(printf '[suite] %-22s %-10s %6ss (budget %ss)%s' "$name" "$status" "$seconds" "$budget" "${note:+  $note}")"
}

budget_for() { # NAME DEFAULT -> the stage's budget (SUITE_BUDGET_<NAME> overrides)
    local var
    var="SUITE_BUDGET_$(printf '%s' "$1" | tr '[:lower:]' '[:upper:]')"
    printf '%s' "${!var:-$2}"
}

selected() { # NAME -> true when SUITE_ONLY is unset or names it
    [[ -z "${SUITE_ONLY:-}" ]] && return 0
    [[ ",${SUITE_ONLY// /}," == *",$1,"* ]]
}

run_stage() { # NAME DEFAULT_BUDGET NOTE COMMAND...
    local name="$1" budget note="$3"
    budget="$(budget_for "$1" "$2")"
    shift 3
    if ! selected "$name"; then
        record "$name" "skipped" "null" 0 "$budget" "not selected (SUITE_ONLY=${SUITE_ONLY})" "$@"
        return
    fi
    local left=$((DEADLINE_S - $(date +%s) - SUMMARY_RESERVE_S))
    if ((left < MIN_STAGE_S)); then
        record "$name" "skipped" "null" 0 "$budget" "suite time limit reached" "$@"
        return
    fi
    if ((budget > left)); then
        note="${note:+$note; }budget cut from ${budget}s to the ${left}s left"
        budget="$left"
    fi
    echo "[suite] $name: $*" >"$STAGE_DIR/logs/$name.log"
    local t0 t1 rc status
    t0="$(date +%s.%N)"
    # in the background and waited for, so that a TERM to the suite is handled at once (see finish)
    timeout --signal=TERM --kill-after=10 "$budget" "$@" >>"$STAGE_DIR/logs/$name.log" 2>&1 </dev/null &
    STAGE_PID=$!
    wait "$STAGE_PID"
    rc=$?
    STAGE_PID=""
    t1="$(date +%s.%N)"
    case "$rc" in
        0) status="ok" ;;
        124 | 137) status="timed_out" ;;
        *) status="failed" ;;
    esac
    if [[ "$status" != "ok" ]]; then
        note="${note:+$note; }$(tail -n 1 "$STAGE_DIR/logs/$name.log" | cut -c1-300)"
        {
            echo "[suite] --- last lines of logs/$name.log ---"
            tail -n 25 "$STAGE_DIR/logs/$name.log"
            echo "[suite] ---"
        } >>"$LOG"
    fi
    record "$name" "$status" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$budget" "$note" "$@"
}

finish() { # the summary and the one archive; runs once, at the end or when the suite is interrupted
    [[ -n "$FINISHED" ]] && return
    FINISHED=1
    if [[ -n "$STAGE_PID" ]]; then
        kill -TERM "$STAGE_PID" 2>/dev/null
        wait "$STAGE_PID" 2>/dev/null
    fi
    local end_s
    end_s="$(date +%s)"
    timeout 60 "$PY" benchmarks/suite.py summary "$STAGE_DIR" "$STAGE_DIR/summary.json" "$MODE" "$((end_s - START_S))" \
        "$TOTAL_S" "${SUITE_GIT_COMMIT:-}" 2>&1 | tee -a "$LOG"
    [[ -f "$STAGE_DIR/summary.json" ]] && cp "$STAGE_DIR/summary.json" "$OUT_DIR/summary.json"
    cp "$LOG" "$STAGE_DIR/suite.log"
    if tar -czf "$OUT_DIR/$NAME.tar.gz.tmp" -C "$WORK" "$NAME"; then
        mv "$OUT_DIR/$NAME.tar.gz.tmp" "$OUT_DIR/$NAME.tar.gz"
        say "[suite] results: $OUT_DIR/$NAME.tar.gz (+ summary.json, suite.log)"
    else
        rm -f "$OUT_DIR/$NAME.tar.gz.tmp"
        say "[suite] could not write the archive; the files are in $STAGE_DIR"
    fi
}

trap 'say "[suite] interrupted: writing the summary and the archive"; finish; exit 130' INT TERM

# ----------------------------------------------------------------------------------------------------------------
# What each stage runs: the GPU configuration, or its toy counterpart on the CPU (--cpu-smoke).
# ----------------------------------------------------------------------------------------------------------------

if [[ "$MODE" == "gpu" ]]; then
    TP=(benchmarks/throughput.py --device cuda --recipe electra-small --seq-len 128 --rounds 10 --warmup 3
        --calls-per-round 20)
    B128=(--batch 128) B256=(--batch 256) B512=(--batch 512) PROFILE=(--profile 5)
    BF16=(--precision bf16) FP16=(--precision fp16) SMOKE_NOTE=""
    MEM=(--device cuda --sizes small --precisions "bf16,fp32" --validate none)
    ATT=(--device cuda --recipe electra-small --batch 128 --precision bf16)
    LOSS=(--device cuda --recipe electra-small --batch 128 --precision bf16 --compile on --steps 20)
else
    TP=(benchmarks/throughput.py --device cpu --recipe tiny --set model.num_layers=1 --seq-len 16 --rounds 2
        --warmup 1 --calls-per-round 2 --threads 1 --no-memory)
    B128=(--batch 2) B256=(--batch 4) B512=(--batch 8) PROFILE=(--profile 2)
    # fp16 autocast is CUDA-only and CUDA graphs do not exist on a CPU: the smoke run keeps every stage and its
    # plumbing, with fp32 for fp16 and the aot_eager backend for inductor (each stage's note says so)
    BF16=(--precision bf16) FP16=(--precision fp32) SMOKE_NOTE="cpu smoke"
    MEM=(--device cpu --sizes tiny --precisions fp32 --validate none --threads 1)
    ATT=(--device cpu --recipe tiny --batch 4 --seq-len 16 --rounds 2 --threads 1)
    LOSS=(--device cpu --recipe tiny --set model.num_layers=1 --batch 2 --seq-len 16 --compile on --steps 3 --threads 1)
    export TINYELECTRA_COMPILE_BACKEND=aot_eager
fi
[[ -n "$DATA" ]] && TP+=(--data "$DATA")
OUTARGS=(--out-dir "$STAGE_DIR")
cache="${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/torchinductor_$(id -un 2>/dev/null || echo user)}"
if [[ -d "$cache" ]] && [[ -n "$(ls -A "$cache" 2>/dev/null)" ]]; then
    SUITE_INDUCTOR_CACHE_AT_START="present ($cache): compile times are warm"
else
    SUITE_INDUCTOR_CACHE_AT_START="empty ($cache): compile times are cold"
fi
export SUITE_INDUCTOR_CACHE_AT_START

say "[suite] mode $MODE, results in $OUT_DIR, work directory $WORK, ${TOTAL_S}s in all; inductor cache $SUITE_INDUCTOR_CACHE_AT_START"

run_stage env 20 "" "$PY" benchmarks/suite.py env "$STAGE_DIR/env.json" "$MODE"
run_stage te_compiled_bf16 210 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B128[@]}" "${BF16[@]}" --compile on --sides tinyelectra \
    "${PROFILE[@]}" "${OUTARGS[@]}" --name te_compiled_bf16
run_stage te_eager_bf16 45 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B128[@]}" "${BF16[@]}" --compile off --sides tinyelectra \
    "${PROFILE[@]}" "${OUTARGS[@]}" --name te_eager_bf16
run_stage hf_eager_bf16 60 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B128[@]}" "${BF16[@]}" --compile off --sides transformers \
    "${OUTARGS[@]}" --name hf_eager_bf16
run_stage hf_compiled_bf16 150 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B128[@]}" "${BF16[@]}" --compile on --sides transformers \
    "${OUTARGS[@]}" --name hf_compiled_bf16
run_stage te_cudagraphs_bf16 150 "${SMOKE_NOTE:+$SMOKE_NOTE: no CUDA graphs on a CPU}" "$PY" "${TP[@]}" "${B128[@]}" \
    "${BF16[@]}" --compile reduce-overhead --sides tinyelectra "${PROFILE[@]}" "${OUTARGS[@]}" --name te_cudagraphs_bf16
run_stage te_compiled_fp16 120 "${SMOKE_NOTE:+$SMOKE_NOTE: fp32 instead of fp16}" "$PY" "${TP[@]}" "${B128[@]}" \
    "${FP16[@]}" --compile on --sides tinyelectra "${OUTARGS[@]}" --name te_compiled_fp16
run_stage memory_small 60 "$SMOKE_NOTE" "$PY" benchmarks/memory.py "${MEM[@]}" "${OUTARGS[@]}" --name memory_small
run_stage attention 30 "$SMOKE_NOTE" "$PY" benchmarks/attention.py "${ATT[@]}" "${OUTARGS[@]}" --name attention
run_stage te_compiled_bf16_b256 100 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B256[@]}" "${BF16[@]}" --compile on \
    --sides tinyelectra "${OUTARGS[@]}" --name te_compiled_bf16_b256
run_stage te_compiled_bf16_b512 100 "$SMOKE_NOTE" "$PY" "${TP[@]}" "${B512[@]}" "${BF16[@]}" --compile on \
    --sides tinyelectra "${OUTARGS[@]}" --name te_compiled_bf16_b512
run_stage loss_check 150 "$SMOKE_NOTE" "$PY" benchmarks/loss_check.py "${LOSS[@]}" "${OUTARGS[@]}" --name loss_check

finish
if grep -q '"status": "\(failed\|timed_out\)"' "$STAGES"; then exit 1; fi
exit 0
