"""How a ``cmd:`` workload is started: directly when it can be, through a shell when not.

Measured on the H200 pod (ncu 2025.3.1, a small transformer script): one ncu pass took
8.4 s as ``ncu … python3 tfm.py`` and 31.8 s as ``ncu … /bin/sh -c 'python3 tfm.py'``:
with ``--target-processes all`` ncu injects itself into the shell too and follows it
through the exec. So a command without shell syntax is split the way the shell would
split it (:mod:`shlex`, POSIX rules) and run as its own argv; leading ``NAME=value``
words become environment variables, as the shell would make them. A command that needs
the shell (pipes, lists, redirections, expansions, globs, builtins) keeps it: a single
simple command gets ``exec`` in front so no shell stays between the profiler and the
program even where ``sh`` does not do that by itself; a list or pipeline runs as typed.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Dict, List, Optional

SHELL = "/bin/sh"

#: Words that mean something only to a shell (keywords and builtins without a program).
SHELL_WORDS = frozenset((
    ".", ":", "!", "{", "}", "[[", "alias", "bg", "break", "case", "cd", "command",
    "continue", "do", "done", "elif", "else", "esac", "eval", "exec", "exit", "export", "fg",
    "fi", "for", "function", "getopts", "hash", "if", "jobs", "local", "read", "readonly",
    "return", "select", "set", "shift", "source", "then", "time", "trap", "type", "ulimit",
    "umask", "unalias", "unset", "until", "wait", "while",
))
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: Outside quotes, these make the shell do more than split words.
_SPECIAL = set("|&;<>()$`*?[]{}~#!\n\r\t\\")
#: Of those, the ones that join several commands (no single program to ``exec``).
_LIST = set("|&;()\n\r{}`")
#: Inside double quotes, the shell still expands these.
_DQ_SPECIAL = set("$`\\")

PYTHON_WORD = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|torchrun|accelerate|deepspeed|pytest"
                         r"|ipython[0-9.]*)$")


class CommandPlan:
    """The argv that starts a ``cmd:`` workload.

    Attributes:
        argv: what to execute.
        env: variables the command sets for itself (``NAME=value`` words before it).
        how: ``exec`` (no shell), ``sh-exec`` (a shell that execs the program) or ``sh``.
        program: the first word of the program, when known (``python3``); None for ``sh``.
    """

    def __init__(self, argv: List[str], env: Dict[str, str], how: str,
                 program: Optional[str]) -> None:
        self.argv = argv
        self.env = env
        self.how = how
        self.program = program

    def __repr__(self) -> str:
        return "CommandPlan(%r, env=%r, how=%r)" % (self.argv, self.env, self.how)


def _scan(command: str) -> "tuple[bool, bool]":
    """(needs a shell, is a list/pipeline): special characters outside single quotes."""
    needs = is_list = False
    quote = ""
    prev_space = True
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            if c == "'":
                quote = ""
        elif quote == '"':
            if c == '"':
                quote = ""
            elif c in _DQ_SPECIAL:
                needs = True
        elif c in "'\"":
            quote = c
        elif c in _SPECIAL:
            if c == "\\" and i + 1 < len(command) and command[i + 1] not in "\n\r":
                i += 1  # an escaped character is literal, and shlex reads it the same way
            elif c == "\t":
                pass  # a word separator for both
            elif c == "#" and not prev_space:
                pass  # a '#' inside a word is literal
            elif c == "!" and not prev_space:
                pass
            else:
                needs = True
                redirect = c == "&" and ((i > 0 and command[i - 1] in "<>")
                                         or command[i + 1:i + 2] == ">")
                if c in _LIST and not redirect:  # "2>&1" and "&>" redirect, not list
                    is_list = True
        prev_space = c in " \t" and not quote
        i += 1
    if quote:
        needs = True  # unbalanced quotes: let the shell say what is wrong
    return needs, is_list


def plan_command(command: str) -> CommandPlan:
    """How to start ``command`` (the text after ``cmd:``) with the least in between."""
    needs_shell, is_list = _scan(command)
    words: List[str] = []
    if not needs_shell:
        try:
            words = shlex.split(command, posix=True)
        except ValueError:
            needs_shell = True
    env: Dict[str, str] = {}
    if not needs_shell:
        while words and _ASSIGNMENT.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if not words or words[0] in SHELL_WORDS:
            needs_shell = True
            env = {}
    if not needs_shell:
        return CommandPlan(words, env, "exec", words[0])
    if not is_list:
        try:
            first = shlex.split(command, posix=True)[:1]
        except ValueError:
            first = []
        word = first[0] if first else ""
        if word and not _ASSIGNMENT.match(word) and word not in SHELL_WORDS \
                and not set(word) & _SPECIAL:
            # One simple command with redirections or expansions: the shell expands
            # them, then replaces itself with the program.
            return CommandPlan([SHELL, "-c", "exec " + command], {}, "sh-exec", word)
    return CommandPlan([SHELL, "-c", command], {}, "sh", None)


#: Programs that start the command after them (their options skipped).
_WRAPPERS = frozenset(("env", "nice", "nohup", "exec", "time", "timeout", "numactl",
                       "taskset", "stdbuf", "sudo", "uv", "poetry", "pipenv", "conda",
                       "run", "ionice", "chrt", "command", "xargs"))


def starts_python(command: str) -> bool:
    """Whether ``command`` (likely) starts a Python interpreter.

    Each command of it (the first word, and the first after ``&&``, ``;``, ``|``…) counts
    when it is a Python interpreter or a launcher of one (``torchrun``, ``accelerate``…),
    also behind wrappers such as ``env``, ``nice``, ``uv run``, ``timeout 60``. The
    injected profiler rides on ``PYTHONPATH``, which every Python the command starts sees.
    """
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        words = command.split()
    at_command = True
    for word in words:
        if word and set(word) <= set("|&;()<>"):
            at_command = word not in ("<", ">", ">>", "<<", ">&", "<&")
            continue
        if not at_command:
            continue
        if _ASSIGNMENT.match(word) or word.startswith("-") or word.isdigit() \
                or word in SHELL_WORDS:
            continue  # still before the program: NAME=v, a wrapper's option, "do", "then"
        name = os.path.basename(word)
        if PYTHON_WORD.match(name):
            return True
        at_command = name in _WRAPPERS
    return False
