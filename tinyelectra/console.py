"""How text reaches a person: `make_console` is the one place that decides it. In a terminal rich wraps to its
width; in a file (CI logs, `2> train.log`) nothing is wrapped, so every line stays whole for grep. It imports nothing
of the package, so every command (flops, prepare, train, glue) can use it without an import loop."""

from __future__ import annotations

FILE_LOG_WIDTH = 400  # columns a table may take when the output is a file; plain lines are never wrapped


def make_console(stderr: bool = True, **options):
    """A rich Console: as rich sets it up in a terminal; unwrapped (soft wrap, wide tables) when writing to a file."""
    from rich.console import Console

    console = Console(stderr=stderr, **options)
    if not console.is_terminal:
        console = Console(stderr=stderr, soft_wrap=True, width=FILE_LOG_WIDTH, **options)
    return console
