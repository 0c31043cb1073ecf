"""git on the laptop with the project's own config unable to run programs.

A project's ``.git/config`` is part of what gpuws is pointed at, not something the person
vetted: ``core.fsmonitor`` is a program git runs on every index read (``ls-files`` and
``diff`` included), a filter driver's ``clean``/``process`` runs on every file git hashes
again, a hook under ``core.hooksPath`` runs when the index is rewritten. Every git
process gpuws starts goes through :func:`run_git`, which overrides those keys on the
command line (``-c`` outranks every config file) and names each filter and diff driver
that the repository's own config (scopes ``local``, ``worktree``) defines, so its
programs are emptied. Drivers only the person's global or system config defines (git-lfs)
keep working: those are the person's own choice.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..errors import WorkspaceError

#: Keys that name a program, overridden for every git process (the ones git could reach
#: from the commands gpuws runs, and the rest for any command added later).
FIXED = (
    "core.fsmonitor=false",  # run on every index read: ls-files, diff, status
    "core.untrackedCache=false",  # (asks the fsmonitor about untracked files)
    "core.hooksPath=/dev/null",  # post-index-change when an index refresh is written
    "core.pager=cat",
    "core.editor=:",
    "sequence.editor=:",
    "core.askPass=",
    "credential.helper=",  # an empty value resets the helper list
    "core.sshCommand=ssh",
    "core.gitProxy=",
    "core.alternateRefsCommand=",
    "diff.external=",
    "gpg.program=gpg",
    "gpg.ssh.program=ssh-keygen",
    "gpg.x509.program=gpgsm",
    "uploadpack.packObjectsHook=",
    "protocol.ext.allow=never",
)
#: Per-driver keys that name a program (``filter.NAME.clean`` ...), and what they become.
DRIVER_KEYS = {
    "filter": {"clean": "", "smudge": "", "process": "", "required": "false"},
    "diff": {"textconv": "", "command": ""},
    "merge": {"driver": ""},
}
#: Config scopes the person controls (any other, ``local`` and ``worktree`` among them,
#: is the repository's own).
TRUSTED_SCOPES = frozenset({"system", "global", "command"})
#: Variables of the person's shell that name programs for git (none is needed for what
#: gpuws asks of it), and what every git process gets: no optional lock, so no index
#: written and no hook after the write; no prompt on a terminal it does not have.
DROP_ENV = ("GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_EDITOR", "GIT_ASKPASS", "GIT_SSH",
            "GIT_SSH_COMMAND")
SET_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
    env.update(SET_ENV)
    return env


def _fixed_args() -> list[str]:
    return [arg for kv in FIXED for arg in ("-c", kv)]


def driver_overrides(root: Path, timeout: float = 30) -> list[str]:
    """``-c`` arguments that empty every program of the drivers the repository's own
    config defines (reading config runs nothing)."""
    def config(*args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(["git", *_fixed_args(), "-C", str(root), "config",
                                   "--list", "--name-only", "-z", *args],
                                  capture_output=True, timeout=timeout, env=git_env(),
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkspaceError(f"git config failed in {root}: {exc}") from exc

    out = config("--show-scope")
    if out.returncode != 0:
        # git older than 2.26 lacks --show-scope: every driver is then the project's. (A
        # config git cannot parse fails here too, and then every git command after it.)
        out = config()
        items = [("local", os.fsdecode(k)) for k in out.stdout.split(b"\0") if k]
    else:
        parts = out.stdout.split(b"\0")
        items = [(os.fsdecode(parts[i]), os.fsdecode(parts[i + 1]))
                 for i in range(0, len(parts) - 1, 2)]
    drivers: set[tuple[str, str]] = set()
    for scope, key in items:
        section, _, rest = key.partition(".")
        sub, _, name = rest.rpartition(".")
        if (scope not in TRUSTED_SCOPES and sub
                and name.lower() in DRIVER_KEYS.get(section.lower(), {})):
            drivers.add((section.lower(), sub))
    args: list[str] = []
    for section, sub in sorted(drivers):
        if "=" in sub or "\n" in sub:
            # `-c` splits at the first '=': such a name cannot be overridden there.
            raise WorkspaceError(f"{root}'s git config defines a {section} driver named "
                                 f"{sub!r}, which gpuws cannot keep from running programs",
                                 remedy=f"remove it from {root}/.git/config")
        for name, value in DRIVER_KEYS[section].items():
            args += ["-c", f"{section}.{sub}.{name}={value}"]
    return args


class SafeGit:
    """git in ``root`` with the project's program-running config overridden; the drivers
    are read once (:func:`driver_overrides`), on the first call that needs them."""

    def __init__(self, root: Path, timeout: float = 120) -> None:
        self.root = root
        self.timeout = timeout
        self._drivers: list[str] | None = None

    def __call__(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """``git ARGS`` (raises OSError, TimeoutExpired, WorkspaceError)."""
        if self._drivers is None:
            self._drivers = driver_overrides(self.root)
        return subprocess.run(["git", *_fixed_args(), *self._drivers, "-C", str(self.root),
                               *args], capture_output=True, timeout=self.timeout,
                              env=git_env(), stdin=subprocess.DEVNULL)


def inside_work_tree(directory: Path) -> bool:
    """Whether ``directory`` lies inside a git work tree (and git is installed);
    ``rev-parse`` reads no index and runs no driver: the fixed overrides suffice."""
    try:
        out = subprocess.run(["git", *_fixed_args(), "-C", str(directory), "rev-parse",
                              "--is-inside-work-tree"], capture_output=True, timeout=30,
                             env=git_env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == b"true"
