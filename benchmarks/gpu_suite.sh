#!/usr/bin/env bash
# The GPU lease in two commands, run back to back on the same warm machine: the first pre-trains ELECTRA-Small on
# the paper's 1M-step schedule, stopped at its first point or where the time ends (checks, parity, speed, then
# tinyelectra train, within 560 s); the second fine-tunes the checkpoint where it stopped and the run's own initial
# weights on GLUE and gives the verdict (within 280 s). Each leaves three files (an archive, a summary and a log whose
# last lines are a short table). The pack travels beside the checkout.
#
#   bash benchmarks/gpu_suite.sh --pack [DIR] [--shared DIR] [--shards N]   # build the pack (default .lease/, ~57 MiB)
#   bash benchmarks/gpu_suite.sh [--lease DIR] [--out DIR]                  # the first command ($OUT unless --out)
#   bash benchmarks/gpu_suite.sh --finish [--out DIR]                       # the second, on the first's run
#   bash benchmarks/gpu_suite.sh --cpu-smoke [--finish] [--out DIR]         # either at toy size on the CPU
#
# PYTHON=... chooses the interpreter (default: the checkout's .venv/bin/python, else python3). The stages, their
# limits and the summaries: benchmarks/gpu_check/suite.py and benchmarks/README.md.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" && -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python" # the checkout's own environment (it does not travel: a GPU machine has python3)
fi
PY="${PYTHON:-$(command -v python3 || true)}"
if [[ -z "$PY" ]]; then
    echo "error: no python3 on PATH (set PYTHON=/path/to/python)" >&2
    exit 2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

case "${1:-}" in
    -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    --pack) shift; exec "$PY" -m benchmarks.gpu_check.pack build "$@" ;;
    *) exec "$PY" -m benchmarks.gpu_check.suite run "$@" ;;
esac
