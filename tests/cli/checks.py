"""What the command line's tests check of a refused command: exit status 2 and one line on stderr."""

import re


def one_line_error(result, pattern: str) -> None:
    """``result`` (a ``CliRunner`` result) failed with exit status 2 and a single stderr line matching
    ``pattern``: a user's mistake is told in one line, never a traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.search(pattern, lines[0]), lines[0]
