"""The lab: experiment notebooks that asked one question each, and their results (benchmarks/lab/results/). Each
script's findings are in benchmarks/lab/README.md; the product does not import from here."""

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"  # the lab's result files (the product's: benchmarks/results)
