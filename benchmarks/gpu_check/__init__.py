"""The GPU-check harness: `bash benchmarks/gpu_suite.sh` runs `python -m benchmarks.gpu_check.suite` (the stages of
a GPU lease's two commands), which starts the product's measurements and `tinyelectra train` / `glue` as processes.
Its tests carry the `gpu_check` marker (tests/test_gpu_suite.py)."""
