"""The one exception type for bad user input: the CLI prints its message as one line and exits non-zero."""


class UserError(Exception):
    """Bad input from the user (a path, a flag, a file). The message is shown as-is, without a traceback."""

    exit_code = 2
