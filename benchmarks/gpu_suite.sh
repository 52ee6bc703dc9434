#!/usr/bin/env bash
# Issue 6, item 4: every GPU measurement of issue 6 in one command, within 9 minutes on one H100-class GPU.
#
#   bash benchmarks/gpu_suite.sh [--data DIR] [--glue-dir DIR] [--out DIR]   # on a machine with a CUDA GPU
#   bash benchmarks/gpu_suite.sh --cpu-smoke                                 # every stage at a toy size on the CPU
#
# Stages (each with its own time budget, seconds; the suite goes on when one fails or runs out of time, and
# records it). In order of importance, so that a slow machine loses the least useful ones:
#   env                  GPU, driver, torch, packages                                  -> env.json
#   throughput_bf16      benchmarks/throughput.py, Small, batch 128, bf16, eager       -> throughput_cuda_bf16.json
#   throughput_bf16_compile                       ... torch.compile on both sides      -> throughput_cuda_bf16_compile.json
#   throughput_fp16      ... fp16 (dynamic loss scaling), eager                        -> throughput_cuda_fp16.json
#   memory_small_base    benchmarks/memory.py --sizes small,base                       -> memory_cuda_small_base.json
#   quality              benchmarks/quality.py at a reduced scale (ELECTRA-Small vs bert-small at equal FLOPs for a
#                        few hundred steps, GLUE RTE/MRPC slices, 1 seed)             -> quality-cuda-short.json/.md
#   memory_large         benchmarks/memory.py --sizes large                            -> memory_cuda_large.json
#   throughput_fp16_compile                                                            -> throughput_cuda_fp16_compile.json
#   summary              suite.json: every stage's status, time and log, headline numbers, the files
# --cpu-smoke names files by what ran (throughput_cpu_fp32-for-fp16.json, ..._eager-for-compile.json).
# CUDA graphs: benchmarks/throughput.py has no option for them yet (its --compile is on|off, inductor's default
# mode); the suite records that stage as skipped until it has one.
#
# Only the packages of a stock CUDA PyTorch image are needed (torch, transformers, tokenizers, safetensors,
# sentencepiece, rich, typer, numpy, matplotlib); nothing is installed or downloaded: the package is imported from
# this checkout (PYTHONPATH). Data: the built-in corpus (Python's documentation, generated on the machine) unless
# --data DIR gives a `tinyelectra prepare` directory; GLUE from --glue-dir (or $TINYELECTRA_SHARED_DATA/glue), else
# synthetic tasks in GLUE's formats (labelled so in the result).
#
# Output: $OUT if set, else --out, else benchmarks/results/gpu-<UTC date>/ (cpu-smoke-<date> for --cpu-smoke):
# the JSON of every stage, logs/<stage>.log, stages.jsonl, quality-reports/, suite.json. Large run directories
# (checkpoints) stay in a temporary work directory ($SUITE_WORK, default mktemp).
# Budgets: SUITE_TOTAL_S (default 530 s for the whole suite) and SUITE_BUDGET_<STAGE> (seconds, stage name in
# capitals) override the defaults; SUITE_QUALITY_STEPS the quality stage's ELECTRA steps; SUITE_GIT_COMMIT names the
# commit where the checkout has no .git (the result files then say "unknown").

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="gpu"
DATA=""
GLUE_DIR=""
OUT_DIR="${OUT:-}"

usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        --cpu-smoke) MODE="smoke" ;;
        --data) DATA="${2:?--data needs a directory}"; shift ;;
        --glue-dir) GLUE_DIR="${2:?--glue-dir needs a directory}"; shift ;;
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
if [[ -z "$GLUE_DIR" && -n "${TINYELECTRA_SHARED_DATA:-}" && -d "$TINYELECTRA_SHARED_DATA/glue" ]]; then
    GLUE_DIR="$TINYELECTRA_SHARED_DATA/glue"
fi
if [[ -n "$GLUE_DIR" && ! -d "$GLUE_DIR" ]]; then
    echo "error: --glue-dir $GLUE_DIR: not a directory" >&2
    exit 2
fi

STAMP="$(date -u +%Y%m%d-%H%M%S)"
if [[ -z "$OUT_DIR" ]]; then
    if [[ "$MODE" == "smoke" ]]; then OUT_DIR="$ROOT/benchmarks/results/cpu-smoke-$STAMP"; else OUT_DIR="$ROOT/benchmarks/results/gpu-$STAMP"; fi
fi
mkdir -p "$OUT_DIR/logs" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="${SUITE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/tinyelectra-suite.XXXXXX")}"
mkdir -p "$WORK"
STAGES="$OUT_DIR/stages.jsonl"
: >"$STAGES"

PY="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
cd "$ROOT" || exit 2

TOTAL_S="${SUITE_TOTAL_S:-530}"
SUMMARY_RESERVE_S=10 # kept for the summary
MIN_STAGE_S=10       # a stage with less time left than this is skipped
START_S="$(date +%s)"
DEADLINE_S=$((START_S + TOTAL_S))

json_str() { # a bash string as a JSON string
    local s="$1"
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="${s//$'\t'/\\t}"
    s="${s//$'\n'/\\n}"
    printf '"%s"' "$s"
}

record() { # NAME STATUS RC SECONDS BUDGET NOTE COMMAND...
    local name="$1" status="$2" rc="$3" seconds="$4" budget="$5" note="$6" log=""
    shift 6
    [[ -f "$OUT_DIR/logs/$name.log" ]] && log="logs/$name.log"
    printf '{"stage": %s, "status": %s, "rc": %s, "seconds": %s, "budget_s": %s, "note": %s, "log": %s, "command": %s}\n' \
        "$(json_str "$name")" "$(json_str "$status")" "$rc" "$seconds" "$budget" "$(json_str "$note")" \
        "$(json_str "$log")" "$(json_str "$*")" >>"$STAGES"
    printf '[suite] %-26s %-10s %6ss (budget %ss)%s\n' "$name" "$status" "$seconds" "$budget" "${note:+  $note}"
}

budget_for() { # NAME DEFAULT -> the stage's budget (SUITE_BUDGET_<NAME> overrides)
    local var
    var="SUITE_BUDGET_$(printf '%s' "$1" | tr '[:lower:]' '[:upper:]')"
    printf '%s' "${!var:-$2}"
}

run_stage() { # NAME DEFAULT_BUDGET NOTE COMMAND...
    local name="$1" budget note="$3"
    budget="$(budget_for "$1" "$2")"
    shift 3
    local left=$((DEADLINE_S - $(date +%s) - SUMMARY_RESERVE_S))
    if ((left < MIN_STAGE_S)); then
        record "$name" "skipped" "null" 0 "$budget" "suite time limit reached" "$@"
        return
    fi
    if ((budget > left)); then
        note="${note:+$note; }budget cut from ${budget}s to the ${left}s left"
        budget="$left"
    fi
    echo "[suite] $name: $*" >"$OUT_DIR/logs/$name.log"
    local t0 t1 rc status
    t0="$(date +%s.%N)"
    timeout --signal=TERM --kill-after=10 "$budget" "$@" >>"$OUT_DIR/logs/$name.log" 2>&1
    rc=$?
    t1="$(date +%s.%N)"
    case "$rc" in
        0) status="ok" ;;
        124 | 137) status="timed_out" ;;
        *) status="failed" ;;
    esac
    if [[ "$status" != "ok" ]]; then
        note="${note:+$note; }$(tail -n 1 "$OUT_DIR/logs/$name.log" | cut -c1-300)"
    fi
    record "$name" "$status" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" "$budget" "$note" "$@"
}

# ----------------------------------------------------------------------------------------------------------------
# What each stage runs: the GPU configuration, or its toy counterpart on the CPU (--cpu-smoke).
# ----------------------------------------------------------------------------------------------------------------

if [[ "$MODE" == "gpu" ]]; then
    DEVICE="cuda"
    THROUGHPUT=(--device cuda --recipe electra-small --batch 128 --seq-len 128 --rounds 20 --warmup 3)
    BF16=(--precision bf16) FP16=(--precision fp16) COMPILE=(--compile on) SMOKE_NOTE=""
    F16_TAG="fp16" COMPILE_TAG="compile"
    MEM_SMALL_BASE=(--device cuda --sizes "small,base" --validate small)
    MEM_LARGE=(--device cuda --sizes large --validate none)
    QSTEPS="${SUITE_QUALITY_STEPS:-500}"
    QUALITY=(--device cuda --preset paper --steps "$QSTEPS" --recipe-set train.compile=off --seeds 1
        --max-train-rows 1000)
    QTASKS="rte,mrpc"
else
    DEVICE="cpu"
    THROUGHPUT=(--device cpu --recipe tiny --batch 4 --seq-len 32 --rounds 2 --warmup 1 --no-memory --threads 1)
    # fp16 autocast and compilation have no quick CPU counterpart: the smoke run keeps the stages and their
    # plumbing, with fp32 for fp16 and eager for compile (each stage's note says so)
    BF16=(--precision bf16) FP16=(--precision fp32) COMPILE=(--compile off) SMOKE_NOTE="cpu smoke"
    F16_TAG="fp32-for-fp16" COMPILE_TAG="eager-for-compile" # file names say what ran
    MEM_SMALL_BASE=(--device cpu --sizes tiny --precisions fp32 --validate tiny --threads 1)
    MEM_LARGE=(--device cpu --sizes tiny --precisions bf16 --validate none --threads 1)
    QSTEPS="${SUITE_QUALITY_STEPS:-8}"
    QUALITY=(--device cpu --preset tiny --steps "$QSTEPS" --threads 1 --recipe-set model.num_layers=2
        --recipe-set train.batch_size=8 --recipe-set train.eval_rows=32 --seeds 1 --max-train-rows 64
        --glue-set epochs=1)
    QTASKS="rte,mrpc"
fi
[[ -n "$DATA" ]] && QUALITY+=(--data "$DATA")
if [[ -n "$GLUE_DIR" ]]; then
    QUALITY+=(--glue-dir "$GLUE_DIR" --tasks "$QTASKS")
else
    QUALITY+=(--synthetic-glue --tasks "sst2,rte")
fi

echo "[suite] mode $MODE, results in $OUT_DIR, work directory $WORK, ${TOTAL_S}s in all"

run_stage env 15 "" "$PY" - "$OUT_DIR/env.json" "$MODE" <<'EOF'
import json, os, platform, subprocess, sys, time
out, mode = sys.argv[1], sys.argv[2]
env = {"mode": mode, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
       "platform": platform.platform(), "executable": sys.executable}
for pkg in ("torch", "transformers", "tokenizers", "safetensors", "sentencepiece", "numpy", "rich", "typer", "matplotlib", "triton"):
    try:
        env[pkg] = __import__(pkg).__version__
    except Exception as e:  # noqa: BLE001
        env[pkg] = f"missing ({type(e).__name__})"
import torch
env["cuda_available"] = torch.cuda.is_available()
if torch.cuda.is_available():
    env["cuda"] = torch.version.cuda
    env["gpu"] = torch.cuda.get_device_name(0)
    env["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    env["bf16_supported"] = torch.cuda.is_bf16_supported()
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                            "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        env["nvidia_smi"] = f"unavailable ({e})"
import tinyelectra
env["tinyelectra_from"] = os.path.dirname(tinyelectra.__file__)
open(out, "w").write(json.dumps(env, indent=2) + "\n")
print(json.dumps(env, indent=2))
if mode == "gpu" and not env["cuda_available"]:
    sys.exit("no CUDA GPU visible to torch: the GPU stages will fail (use --cpu-smoke on a CPU)")
EOF

run_stage throughput_bf16 50 "$SMOKE_NOTE" "$PY" benchmarks/throughput.py "${THROUGHPUT[@]}" "${BF16[@]}" \
    --out-dir "$OUT_DIR" --name "throughput_${DEVICE}_bf16"
run_stage throughput_bf16_compile 90 "${SMOKE_NOTE:+$SMOKE_NOTE: eager instead of compile}" \
    "$PY" benchmarks/throughput.py "${THROUGHPUT[@]}" "${BF16[@]}" "${COMPILE[@]}" \
    --out-dir "$OUT_DIR" --name "throughput_${DEVICE}_bf16_${COMPILE_TAG}"
run_stage throughput_fp16 45 "${SMOKE_NOTE:+$SMOKE_NOTE: fp32 instead of fp16}" \
    "$PY" benchmarks/throughput.py "${THROUGHPUT[@]}" "${FP16[@]}" \
    --out-dir "$OUT_DIR" --name "throughput_${DEVICE}_${F16_TAG}"
if "$PY" benchmarks/throughput.py --help 2>/dev/null | grep -q -- "--cuda-graphs"; then
    record throughput_cuda_graphs "skipped" "null" 0 0 \
        "throughput.py now has --cuda-graphs: add its exact form to gpu_suite.sh" "$PY" benchmarks/throughput.py
else
    record throughput_cuda_graphs "skipped" "null" 0 0 \
        "benchmarks/throughput.py has no CUDA-graphs option yet (--compile is on|off, inductor's default mode)" \
        "$PY" benchmarks/throughput.py
fi
run_stage memory_small_base 45 "$SMOKE_NOTE" "$PY" benchmarks/memory.py "${MEM_SMALL_BASE[@]}" \
    --out-dir "$OUT_DIR" --name "memory_${DEVICE}_small_base"
run_stage quality 140 "$SMOKE_NOTE" "$PY" benchmarks/quality.py "${QUALITY[@]}" --work-dir "$WORK/quality-runs" \
    --out-dir "$OUT_DIR" --name "quality-${DEVICE}-short" \
    --note "gpu_suite.sh ($MODE): a short run checking the machinery and its speed, not a quality result"
mkdir -p "$OUT_DIR/quality-reports"
for side in electra mlm; do
    for f in report.md report.json; do
        [[ -f "$WORK/quality-runs/$side/$f" ]] && cp "$WORK/quality-runs/$side/$f" "$OUT_DIR/quality-reports/$side-$f"
    done
    [[ -f "$WORK/quality-runs/$side/summary.json" ]] && cp "$WORK/quality-runs/$side/summary.json" "$OUT_DIR/quality-reports/$side-summary.json"
done
run_stage memory_large 45 "$SMOKE_NOTE" "$PY" benchmarks/memory.py "${MEM_LARGE[@]}" \
    --out-dir "$OUT_DIR" --name "memory_${DEVICE}_large"
run_stage throughput_fp16_compile 80 "${SMOKE_NOTE:+$SMOKE_NOTE: fp32 and eager instead of fp16 and compile}" \
    "$PY" benchmarks/throughput.py "${THROUGHPUT[@]}" "${FP16[@]}" "${COMPILE[@]}" \
    --out-dir "$OUT_DIR" --name "throughput_${DEVICE}_${F16_TAG}_${COMPILE_TAG}"

# ----------------------------------------------------------------------------------------------------------------
# Summary: suite.json with every stage and the headline numbers (the summary's own time is outside the budgets).
# ----------------------------------------------------------------------------------------------------------------

SUITE_END_S="$(date +%s)"
timeout 60 "$PY" - "$OUT_DIR" "$MODE" "$((SUITE_END_S - START_S))" "$TOTAL_S" "${SUITE_GIT_COMMIT:-}" <<'EOF'
import json, os, subprocess, sys, time
from pathlib import Path
out, mode, seconds, total_s, commit_env = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines() if line.strip()]
try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
except (OSError, subprocess.CalledProcessError):
    commit = f"{commit_env} (from SUITE_GIT_COMMIT)" if commit_env else "unknown (no .git; set SUITE_GIT_COMMIT)"
files, headline = {}, {}
for path in sorted(out.glob("*.json")):
    if path.name == "suite.json":
        continue
    try:
        doc = json.loads(path.read_text())
    except ValueError:
        continue
    if doc.get("git_commit") == "unknown" and commit_env:  # the checkout had no .git: name the commit given
        doc["git_commit"] = f"{commit_env} (from SUITE_GIT_COMMIT)"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    files[path.name] = doc.get("benchmark", path.stem)
    name = path.stem
    if name.startswith("throughput"):
        te, hf = doc.get("tinyelectra", {}), doc.get("transformers", {})
        headline[name] = {"precision": doc.get("precision"), "compile": doc.get("compile"), "batch": doc.get("batch_size"),
                          "tinyelectra_tokens_per_s": te.get("tokens_per_s"), "transformers_tokens_per_s": hf.get("tokens_per_s"),
                          "speedup": (doc.get("speedup") or {}).get("median_of_round_ratios"),
                          "tinyelectra_mfu": te.get("hardware_mfu"), "tinyelectra_peak_memory_bytes": te.get("peak_memory_bytes"),
                          "compile_note": te.get("compile_note")}
    elif name.startswith("memory"):
        for size, s in (doc.get("sizes") or {}).items():
            for row in s.get("configurations", []):
                cards = row["cards"]["adam (paper, fp32 state)"]
                key = f"{size} {row['precision']} ckpt={'on' if row['grad_checkpointing'] else 'off'}"
                headline.setdefault("memory_peak_gib_at_recipe_batch", {})[key] = cards["peak_at_recipe_batch_gib"]
    elif name.startswith("quality"):
        runs = doc.get("runs", {})
        headline[name] = {side: {"steps": (r.get("pretraining") or {}).get("steps"),
                                 "tokens_per_second": (r.get("pretraining") or {}).get("tokens_per_second"),
                                 "glue_average": (r.get("glue") or {}).get("average")} for side, r in runs.items()}
        headline[name]["complete"] = doc.get("complete")
suite = {"benchmark": "gpu_suite", "mode": mode, "git_commit": commit,
         "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": seconds, "time_limit_s": total_s,
         "within_time_limit": seconds <= total_s, "stages": stages, "files": files, "headline": headline}
if (out / "env.json").is_file():
    suite["env"] = json.loads((out / "env.json").read_text())
tmp = out / "suite.json.tmp"
tmp.write_text(json.dumps(suite, indent=2) + "\n")
os.replace(tmp, out / "suite.json")
bad = [s["stage"] for s in stages if s["status"] not in ("ok", "skipped")]
print(f"[suite] {len([s for s in stages if s['status'] == 'ok'])}/{len(stages)} stages ok"
      + (f"; not ok: {', '.join(bad)}" if bad else "") + f"; {seconds} s; -> {out / 'suite.json'}")
EOF
echo "[suite] results in $OUT_DIR"
if grep -q '"status": "\(failed\|timed_out\)"' "$STAGES"; then exit 1; fi
exit 0
