#!/usr/bin/env bash
# The GPU run in one command: what a user runs (tinyelectra train --gpu 0, then tinyelectra glue) and the speed
# measurements, within 570 s on a bare GPU machine; three files come back: an archive, summary.json and suite.log,
# whose last lines are a short table. The pack (pre-training rows and GLUE tasks) travels beside the checkout.
#
#   bash benchmarks/gpu_suite.sh --pack [DIR] [--shared DIR] [--shards N]   # build the pack (default .lease/, ~50 MiB)
#   bash benchmarks/gpu_suite.sh [--lease DIR] [--out DIR]                  # the GPU run ($OUT when set)
#   bash benchmarks/gpu_suite.sh --cpu-smoke [--out DIR]                    # every stage at toy size on the CPU
#
# PYTHON=... chooses the interpreter (default: the checkout's .venv/bin/python, else python3). The stages, their
# limits and the summary: benchmarks/suite.py and benchmarks/README.md.

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
    -h | --help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    --pack) shift; exec "$PY" "$ROOT/benchmarks/pack.py" build "$@" ;;
    *) exec "$PY" "$ROOT/benchmarks/suite.py" run "$@" ;;
esac
