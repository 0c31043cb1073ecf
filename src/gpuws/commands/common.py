"""What every pod-facing command shares: connecting, and printing errors the same way."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..text.textsafe import visible_lines

if TYPE_CHECKING:
    from rich.console import Console

    from ..client import AgentClient
    from ..live.link import Target
    from ..transport import Transport


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="ssh alias, user@host[:port], or 'local' for this machine")
    p.add_argument("-F", dest="ssh_config", metavar="FILE",
                   help="ssh config file (default ~/.ssh/config)")
    p.add_argument("-p", dest="port", type=int, help="port (overrides the config)")
    p.add_argument("-l", dest="user", help="remote user (overrides the config)")
    p.add_argument("--accept-new", action="store_true",
                   help="record an unknown host key (like StrictHostKeyChecking=accept-new); "
                        "a changed key is still refused")
    p.add_argument("--python", default="python3",
                   help="the pod's python; by default gpuws searches the pod's "
                        "pythons (conda, venv, pyenv, PATH) for the one with CuPy/torch "
                        "(`gpuws doctor` says which), and naming one turns the search off")
    p.add_argument("--pty", action="store_true",
                   help="reach the pod through an interactive terminal only (a proxy that "
                        "refuses exec and SFTP, like RunPod's basic SSH); detected by itself "
                        "when the server refuses exec")
    p.add_argument("--no-persist", dest="persist", action="store_false",
                   help="neither use nor leave a kept connection to the host (the "
                        "config's `persist`) for this command")


def transport_for(args: argparse.Namespace) -> Transport:
    """The transport the connection arguments name (not connected: nothing is sent)."""
    # The client, the link and the transports (ssl, the deploy bundle) are imported by
    # the commands that connect: `gpuws --help`, `history`, `sessions` never do.
    from ..transport import make_transport
    from ..transport.persist import idle_for

    return make_transport(args.host, config_file=args.ssh_config, port=args.port,
                          user=args.user, accept_new=args.accept_new,
                          pty=True if getattr(args, "pty", False) else None,
                          persist_s=idle_for(args.host, enabled=getattr(args, "persist", True)))


def target_of(args: argparse.Namespace) -> Target:
    """Where to connect, from the connection arguments every pod command shares."""
    from ..live.link import Target

    return Target(args.host, ssh_config=args.ssh_config, port=args.port, user=args.user,
                  python=args.python, rate=getattr(args, "rate", None),
                  accept_new=args.accept_new, pty=True if getattr(args, "pty", False) else None,
                  persist=getattr(args, "persist", True))


async def connect(args: argparse.Namespace, transport: Transport | None = None) -> AgentClient:
    """Connect (``transport``, or the one the arguments name) and start the agent.

    A kept connection's master that goes away meanwhile is said in one line and the
    connection is made once more (a new master)."""
    from ..client import AgentClient
    from ..errors import GpuwsError

    used = transport or transport_for(args)
    try:
        return await AgentClient.connect(used, python=args.python)
    except GpuwsError:
        from ..transport.persist.client import went_away

        reason = went_away(used)
        if reason is None:
            raise
        sys.stderr.write(f"gpuws: {reason}; connecting again\n")
        return await AgentClient.connect(transport_for(args), python=args.python)


def console(stderr: bool = False, markup: bool = True) -> Console:
    """A console for people. ``markup=False`` for anything that prints pod text: no
    ``[...]`` is parsed then, so only :class:`rich.text.Text` styles show. No control
    character in any text reaches the terminal (:class:`.safeconsole.TerminalSafeConsole`).
    Rich is imported here, by the first command that prints for people: `sync --json`
    never loads it."""
    from .safeconsole import TerminalSafeConsole

    out = TerminalSafeConsole(stderr=stderr, highlight=False, soft_wrap=False,
                              markup=markup, emoji=markup)
    # Into a pipe or a file (a CI log) Rich would fold every line at 80 columns, splitting
    # a printed command in two and starting its continuation at column 0; lines go whole
    # there (tables still take the console's width).
    out.soft_wrap = not out.is_terminal
    return out


def print_json(data: Any) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def usd(text: str) -> float:
    """argparse type of a price in US dollars: a finite number, zero or more. Checked as
    the arguments are read, so a mistake costs no connection."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: a price must be a finite number ≥ 0")
    return value


def check_output(output: str | None) -> None:
    """Refuse an ``-o`` path that cannot take a report, before any work is done.

    Raises:
        UsageError: the path is a directory, its directory does not exist or is not one,
            or it cannot be written there.
    """
    if not output or output == "-":
        return
    path = Path(output)
    parent = path.parent if str(path.parent) else Path(".")
    remedy = "give -o a file path in an existing, writable directory (or - for stdout)"
    if path.is_dir():
        raise UsageError(f"{output} is a directory", remedy=remedy)
    if not parent.exists():
        raise UsageError(f"{output}: the directory {parent} does not exist", remedy=remedy)
    if not parent.is_dir():
        raise UsageError(f"{output}: {parent} is not a directory", remedy=remedy)
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists()
                                                    and not os.access(path, os.W_OK)):
        raise UsageError(f"{output}: not writable", remedy=remedy)


def write_report(text: str, output: str | None) -> None:
    """A markdown report to ``output`` (``-`` or None: stdout), written whole or not at all.

    Raises:
        UsageError: the file could not be written (nothing is left behind).
    """
    if output and output != "-":
        check_output(output)
        path = Path(output)
        data = text.encode()
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)  # never leave a half-written report behind
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UsageError(f"{output}: {exc.strerror or exc}",
                             remedy="give -o a writable file path (or - for stdout)") from exc
        # A path is not markup, and wrapping it would cut it for whoever copies it.
        console(stderr=True, markup=False).print(f"wrote {path} ({len(data):,} bytes)",
                                                 highlight=False, soft_wrap=True)
    else:
        # A report is made terminal-safe where it is built (sessions/export.py); this pass
        # keeps any other text handed here from sending an escape to a terminal.
        sys.stdout.write(visible_lines(text))


def add_run_args(p: argparse.ArgumentParser) -> None:
    """``gpuws run``'s arguments. Here, not in :mod:`.run`, so that building the parser
    for any command does not import the run's engine (~40 ms of every start)."""
    add_connection_args(p)
    p.add_argument("--workload", "-w", required=True,
                   help="builtin:NAME[?k=v&...], file:PATH or cmd:COMMAND")
    p.add_argument("--tiers", default="1,2,3", help="comma-separated tiers (default 1,2,3)")
    p.add_argument("--workspace", "-W", metavar="DIR",
                   help="bring this project directory to the pod first (only changed files "
                        "travel) and run in it: cmd: starts there, file:PATH is a path inside "
                        "it with its root on sys.path; the run records the tree and git commit")
    p.add_argument("--gpu", metavar="N|UUID",
                   help="the GPU to run on, through every tier: its index (0, 1, …) or its "
                        "UUID as nvidia-smi -L prints it (GPU-…, MIG-…; a unique prefix is "
                        "enough); `gpuws doctor HOST` lists them (default: CUDA's first)")
    t1 = p.add_argument_group("Tier 1 (CUDA events)")
    t1.add_argument("--target-ci", default="0.01",
                    help="stop Tier 1 when the median's 95%% CI is within ± this of it: 1%% "
                         "(or the share 0.01, the default)")
    t1.add_argument("--max-seconds", type=float, default=10.0, help="time budget for sampling")
    t1.add_argument("--min-samples", type=int, default=10,
                    help="Tier 1 takes at least this many samples before the CI target may "
                         "stop it (default 10)")
    t1.add_argument("--warmup", type=int, default=5,
                    help="untimed calls before Tier 1 starts timing (default 5)")
    mode = t1.add_mutually_exclusive_group()
    mode.add_argument("--cold", dest="timing", action="store_const", const="cold",
                      default="auto",
                      help="flush L2 clean and idle 1 ms before every sample: the "
                           "conditions ncu measures in (default for calls >= 10 us)")
    mode.add_argument("--hot", dest="timing", action="store_const", const="hot",
                      help="back-to-back samples, L2 warm: steady-state throughput "
                           "(default for calls < 10 us, which are batched)")
    t3 = p.add_argument_group("Tier 3 (Nsight Compute)")
    t3.add_argument("--kernel-regex", "-k", help="kernels to profile (default: Tier 2's top)")
    t3.add_argument("--launch-skip", type=int, default=0,
                    help="matching kernel launches ncu skips before profiling (default 0)")
    t3.add_argument("--launch-count", type=int, default=1,
                    help="matching kernel launches ncu profiles (default 1)")
    t3.add_argument("--rank", type=int, default=None, metavar="N",
                    help="where the command starts several ranks (torchrun, mpirun): the "
                         "rank whose process ncu profiles (default 0); the others run "
                         "unprofiled")
    t3.add_argument("--ncu-set", help="a section set from `ncu --list-sets` instead of the "
                                      "focused default")
    t3.add_argument("--ncu-sections", help="comma-separated section identifiers")
    t3.add_argument("--max-tier3-seconds", dest="max_tier3_seconds", type=float,
                    metavar="S", help="stop Tier 3 before ncu starts when its estimate "
                    "(passes × launches × kernel time, plus start) exceeds S seconds; "
                    "the run fails (exit 7) naming a cheaper plan")
    t3.add_argument("--replay-mode", choices=["kernel", "application", "range", "app-range"],
                    help="ncu's --replay-mode (default: ncu's own)")
    t3.add_argument("--clock-control", choices=["none", "base"], default="none",
                    help="none (default) keeps the clocks Tier 1 saw")
    t3.add_argument("--cache-control", choices=["all", "none"], default="all",
                    help="ncu's --cache-control: all (default) flushes caches between passes, "
                         "none keeps them")
    t3.add_argument("--ncu", dest="ncu_path", help="use this ncu instead of the selected one")
    p.add_argument("--profile-iters", type=int, default=10,
                   help="workload calls per profiled process (Tier 2/3)")
    p.add_argument("--timeout", type=float, help="kill a workload process after this many s")
    p.add_argument("--install-cupy", action="store_true",
                   help="install the CuPy wheel that fits the driver if the pod has none")
    p.add_argument("--env", action="append", default=[], metavar="K=V|K",
                   help="environment for the workload (repeatable); --env K passes this "
                        "shell's value of K, kept out of the process list")
    p.add_argument("--env-file", action="append", default=[], metavar="FILE",
                   help="KEY=VALUE lines for the workload's environment (repeatable; "
                        "for secrets: nothing shows in the process list)")
    p.add_argument("--rate", type=usd, help="the pod's price in USD per hour")
    p.add_argument("--start", action="store_true",
                   help="if the host does not answer, start it with its `start` command "
                        "from the config and wait for SSH (on a terminal gpuws asks)")
    p.add_argument("--detach", action="store_true",
                   help="start the run, print its id and return; it goes on on the pod")
    p.add_argument("--no-pull", action="store_true", help="leave the artifacts on the pod")
    p.add_argument("--baseline", help="compare with this run id (from the store)")
    p.add_argument("--fail-if-slower", type=float, metavar="PCT",
                   help="exit non-zero when slower than the baseline by more than PCT%% "
                        "beyond noise")
    p.add_argument("--json", action="store_true", help="print the run's events as NDJSON")
