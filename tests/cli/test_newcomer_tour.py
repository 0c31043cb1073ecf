"""The newcomer's second tour (issue 34): each rough edge it found, through the real CLI
as a person meets it, with no terminal (stdin from /dev/null, output to a pipe)."""

from __future__ import annotations

import os

import pytest

# The real CLI with no terminal, and its one `gpuws: …` line: test_entry_points' own.
from cli.test_entry_points import gpuws  # type: ignore[import-not-found]
from cli.test_entry_points import one_clean_line as one_line  # type: ignore[import-not-found]


@pytest.mark.parametrize("argv, says", [
    (("connect", "local"), "`gpuws doctor local`"),
    ((), "`gpuws --help`"),
])
def test_the_tui_without_a_terminal_is_refused_not_left_hanging(
        argv: tuple[str, ...], says: str) -> None:
    """Finding 11: `gpuws connect local` and bare `gpuws` with no terminal wrote escape
    codes into the pipe until killed; now one line and exit 2, nothing on stdout."""
    res = gpuws(*argv)
    line = one_line(res, 2)
    assert "needs a terminal" in line and says in line, line
    assert res.stdout == ""


@pytest.mark.parametrize("typed, meant", [("doctr", "doctor"), ("histroy", "history"),
                                          ("exprt", "export")])
def test_a_mistyped_command_names_the_one_meant(typed: str, meant: str) -> None:
    """Finding 26: `gpuws doctr local` printed argparse's list of 20 commands."""
    line = one_line(gpuws(typed, "local"), 2)
    assert f"no command '{typed}'" in line and f"did you mean `gpuws {meant}`?" in line, line


def test_an_unknown_word_with_no_near_command_says_where_the_list_is() -> None:
    line = one_line(gpuws("-F", "/dev/null", "frobnicate"), 2)
    assert "did you mean" not in line and "`gpuws --help` lists the commands" in line
    # A hostile word is shown, never interpreted by the terminal.
    line = one_line(gpuws("\x1b]0;pwned\x07doc"), 2)
    assert "\x1b" not in line and "\x07" not in line


def test_a_pasted_command_line_is_no_host_and_is_said_so() -> None:
    """Finding 13b: text typed into Home's box (or after `gpuws doctor`) was called a
    configuration error, with an unquoted `ssh -G …` that ran a second command when pasted."""
    line = one_line(gpuws("doctor", "clear; gpuws connect local"), 2)
    assert "'clear; gpuws connect local' is not a host name" in line, line
    assert "ssh -G" not in line and "Configuration error" not in line


def test_lines_into_a_pipe_are_not_folded_at_80_columns() -> None:
    """Finding 15: into a pipe (a CI log) a printed command was cut in two at column 80."""
    from gpuws.commands.common import console

    env_columns = os.environ.pop("COLUMNS", None)
    try:
        out = console()
        with out.capture() as captured:
            out.print("follow it with `gpuws attach pod 20261128-093529-9399ece5` " + "x" * 80)
    finally:
        if env_columns is not None:
            os.environ["COLUMNS"] = env_columns
    assert len(captured.get().rstrip("\n").splitlines()) == 1
