"""User-facing errors: one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad input from the user (a path, a value, a file). The CLI prints `error: <msg>` and exits 2."""

    exit_code = 2
