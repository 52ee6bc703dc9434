"""`python -m tinyelectra ...` is the same as the `tinyelectra` console script (and what torchrun calls)."""

from tinyelectra.cli import main

main()
