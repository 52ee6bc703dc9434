"""What ends a command early: bad user input (`UserError`, one line and exit code 2), a run whose loss or weights
became non-finite (`Diverged`, one line and exit code 3) and an interrupt (`Interrupted`, SIGINT or SIGTERM turned
into an exception so that clean-up runs and the command can say what it kept)."""

from __future__ import annotations

import contextlib
import signal


class UserError(Exception):
    """Bad input from the user (a path, a flag, a file). The message is shown as-is, without a traceback."""

    exit_code = 2


class Diverged(UserError):
    """A loss or the weights became non-finite (NaN or inf): the run stops, saying where, what it kept and what to
    try. Exit code 3, so that a script tells a diverged run from bad input (2)."""

    exit_code = 3


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) or SIGTERM. Exit code 130 or 143, as a shell reports a process ended by that signal.
    Not a KeyboardInterrupt: click would turn that into "Aborted!" and exit code 1 before the command line sees it."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return 143 if self.signal_name == "SIGTERM" else 130


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupts_raise():
    """Within this block SIGINT and SIGTERM raise `Interrupted` (SIGTERM would otherwise end the process on the spot,
    skipping every `finally` and leaving temporary files behind)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, _raise_interrupted)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
