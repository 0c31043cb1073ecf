"""The ``gpuws`` command line. Thin: parses arguments and hands off to a command.

Heavy imports (textual, asyncssh) happen inside the subcommands that need them, so
``gpuws sessions`` or ``gpuws report`` start fast and never load the TUI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from . import __version__
from .errors import (
    AgentError,
    ConnectError,
    DeployError,
    GpuwsError,
    ProtocolError,
    RunError,
    StoreError,
    TransferError,
    UsageError,
)

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

#: What each exit status means (the README's table is this one).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (GpuwsError.exit_code, "any other error gpuws explains (one line: cause — remedy)"),
    (UsageError.exit_code, "usage or configuration mistake (a bad option, workload or id), "
                           "caught before connecting"),
    (ConnectError.exit_code, "cannot connect: unknown host, authentication, host key"),
    (DeployError.exit_code, "the agent could not start on the pod (e.g. no python3)"),
    (ProtocolError.exit_code, "the laptop and the agent do not understand each other"),
    (AgentError.exit_code, "the agent refused or failed a request"),
    (RunError.exit_code, "the run failed (everything it recorded is stored)"),
    (StoreError.exit_code, "the session store cannot be opened, read or written"),
    (TransferError.exit_code, "an artifact could not be pulled or failed its sha256"),
    (10, "run --fail-if-slower: slower than the baseline beyond noise and the limit, or "
         "not comparable with it (another GPU model, another timing mode)"),
    (11, "ncu: no Nsight Compute on the pod fits its driver and GPU"),
    (12, "run POD POD ...: one or more pods of the fleet gave no result (each named on "
         "stderr: cause — remedy); the others' results are kept"),
    (130, "interrupted (Ctrl+C); a run goes on on the pod"),
)


def _bounded(kind: Callable[[str], float], low: float, high: float) -> Callable[[str], float]:
    """argparse type of a number in [low, high], checked as the arguments are read."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:  # NaN fails this too
            raise argparse.ArgumentTypeError(
                f"{text}: give a number from {low:,.0f} to {high:,.0f}")
        return value
    return parse


def make_parser() -> argparse.ArgumentParser:
    from .commands.common import add_connection_args, add_run_args, usd

    epilog = "exit status:\n" + "\n".join(f"  {code:>3}  {meaning}"
                                           for code, meaning in EXIT_CODES)
    parser = argparse.ArgumentParser(
        prog="gpuws", description="A terminal profiling workstation for rented GPU pods.",
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gpuws {__version__}")
    parser.add_argument("-F", dest="ssh_config", metavar="FILE",
                        help="ssh config file for Home's host list (with no COMMAND)")
    parser.set_defaults(func=_tui("home"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("connect", help="open the workstation on a pod (the TUI)")
    add_connection_args(p)
    p.add_argument("--rate", type=usd, help="the pod's price in USD per hour")
    p.set_defaults(func=_tui("connect"))

    p = sub.add_parser("replay", help="play a recorded run through the live panes (the TUI)")
    p.add_argument("source", metavar="FILE|SESSION",
                   help="a run's events.ndjson, or a session id (or unique prefix)")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0,
                      help="play N times faster than recorded (default 1)")
    pace.add_argument("--instant", action="store_true", help="show everything at once")
    p.add_argument("--run", metavar="RUN_ID",
                   help="only this run of the session or file (`gpuws history SESSION` lists "
                        "a session's runs)")
    p.set_defaults(func=_tui("replay"))

    for which, what in (("start", "start the pod with the host's `start` command, then wait "
                                   "for SSH"),
                        ("stop", "stop the pod with the host's `stop` command, then check it "
                                 "stopped")):
        p = sub.add_parser(which, help=what)
        add_connection_args(p)
        p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                       help=f"seconds the `{which}` command may run (default 300)")
        p.add_argument("--wait", type=float, default=300.0, metavar="S",
                       help="seconds to wait for SSH to "
                            + ("answer" if which == "start" else "stop answering")
                            + " (default 300)")
        p.set_defaults(func=_lazy("lease", which))

    p = sub.add_parser("doctor", help="deploy the agent and show what the pod has")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--install-nsys", action="store_true",
                   help="run the pod's Nsight Systems install plan (shown by doctor; asks "
                        "first), then verify it with a smoke profile")
    p.add_argument("--yes", action="store_true",
                   help="confirm --install-nsys without asking (for scripts)")
    p.set_defaults(func=_lazy("doctor", "doctor"))

    p = sub.add_parser("run", help="run a workload through the profiling tiers (on several "
                                   "pods at once: a fleet)")
    add_run_args(p)
    p.add_argument("more_pods", nargs="*", metavar="POD",
                   help="more pods, right after the first: run the workload on every pod at "
                        "once, each its own session, and end with one table comparing them "
                        "with the first (a fleet; `gpuws fleets` lists them)")
    p.set_defaults(func=_run)

    p = sub.add_parser("attach", help="follow a run on the pod (after --detach or a drop)")
    add_connection_args(p)
    p.add_argument("run_id", help="the run's id (`gpuws runs HOST` lists the pod's runs)")
    p.add_argument("--from-seq", type=int, help="first event to receive (default: after the "
                                                 "last one stored)")
    p.add_argument("--no-pull", action="store_true",
                   help="leave the run's artifacts on the pod (`gpuws pull` fetches them later)")
    p.add_argument("--json", action="store_true", help="print the run's events as NDJSON")
    p.set_defaults(func=_lazy("run", "attach"), baseline=None, fail_if_slower=None)

    p = sub.add_parser("cancel", help="cancel a run (kills its process group on the pod)")
    add_connection_args(p)
    p.add_argument("run_id", help="the run's id (`gpuws runs HOST` lists the pod's runs)")
    p.set_defaults(func=_lazy("run", "cancel"))

    p = sub.add_parser("runs", help="list the runs on the pod (stored runs: gpuws history)")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("run", "runs"))

    p = sub.add_parser("watch", help="measure on every save: sync the project, run Tier 1 "
                                     "(or --tiers), print one verdict line per iteration")
    add_run_args(p)
    p.add_argument("--debounce-ms", type=int, default=300,
                   help="saves within this many ms make one iteration (default 300)")
    p.add_argument("--no-fork-server", dest="fork_server", action="store_false",
                   help="start each Tier-1 child as a fresh interpreter and probe the pod "
                        "for each run (by default the pod forks the child from a parent "
                        "that imported CuPy/torch/Triton once, and is probed once)")
    p.add_argument("--yes", action="store_true",
                   help="watch even where no save can be measured: a cmd: workload (no "
                        "Tier 1) or a pod without a GPU, which are refused otherwise")
    p.set_defaults(func=_lazy("watch", "watch"), tiers="1")
    # add_run_args wrote run's default (1,2,3) into --tiers' help; watch's is Tier 1.
    for action in p._actions:
        if action.dest == "tiers":
            action.default, action.help = "1", "comma-separated tiers (default 1)"

    p = sub.add_parser("sync", help="bring a project directory to the pod (only changed files "
                                    "travel); `run -W DIR` does it before a run")
    add_connection_args(p)
    p.add_argument("--workspace", "-W", metavar="DIR", default=".",
                   help="the project directory (default: here)")
    p.add_argument("--json", action="store_true", help="print what was sent as JSON")
    p.set_defaults(func=_lazy("sync", "sync"))

    p = sub.add_parser("ncu", help="which Nsight Compute fits the pod; install one")
    add_connection_args(p)
    p.add_argument("--install", action="store_true",
                   help="run the install plan (asks first), then verify the ncu with a "
                        "smoke profile; with an ncu that fits, only verify it")
    p.add_argument("--yes", action="store_true",
                   help="confirm --install without asking (for scripts)")
    p.add_argument("--json", action="store_true", help="machine-readable output (the plan)")
    p.set_defaults(func=_lazy("run", "ncu"))

    p = sub.add_parser("report", help="read a .ncu-rep or an ncu CSV here (no pod needed)")
    p.add_argument("file", help="a pulled .ncu-rep (needs the report extra, which scripts/run "
                                "installs) or the CSV of `ncu --csv --page raw`")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    # The bounds of the child that parses the file (gpuws/report_child.py): a person whose
    # honest report is long can raise them; a hostile file meets them.
    p.add_argument("--max-memory", type=_bounded(int, 128, 1 << 20), default=1024,
                   metavar="MIB", help="memory the parser may use (default 1024 MiB)")
    p.add_argument("--timeout", type=_bounded(float, 1, 86400), default=60.0, metavar="S",
                   help="seconds the parser may take (default 60)")
    p.set_defaults(func=_lazy("report_cmd", "report"))

    p = sub.add_parser("sessions", help="list recorded sessions with what they cost")
    p.add_argument("--limit", type=_bounded(int, 1, 10**9), metavar="N",
                   help="only the N newest sessions (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("history", "sessions"))

    p = sub.add_parser("history", help="list the stored runs: id, workload, status, Tier-1 "
                                       "median (where run ids are found)")
    p.add_argument("session", nargs="?", metavar="SESSION",
                   help="only this session's runs (id or unique prefix; default: all)")
    p.add_argument("--limit", type=_bounded(int, 1, 10**9), metavar="N",
                   help="only the N newest runs (default: all, streamed session by session)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("history", "history"))

    p = sub.add_parser("fleets", help="list the fleets (one workload run on several pods at "
                                      "once)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("fleet", "fleets"))

    p = sub.add_parser("export", help="write a session (or a fleet's comparison) as a markdown "
                                      "report")
    p.add_argument("session", nargs="?", help="session id (or a unique prefix)")
    p.add_argument("--fleet", metavar="ID", help="write this fleet's comparison instead (id or "
                                                 "unique prefix; `gpuws fleets` lists them)")
    p.add_argument("-o", "--output", help="file to write (default stdout); with a file, each "
                   "run's pictures (timeline, roofline) are written beside it as SVG files "
                   "the report links")
    p.add_argument("--no-images", action="store_true",
                   help="write the report without its SVG pictures (and without their links)")
    p.set_defaults(func=_export)

    p = sub.add_parser("compare", help="compare two runs (speedup with CI, Cliff's delta)")
    p.add_argument("run_a", metavar="RUN_A", help="the reference run (id or unique prefix; "
                                                  "`gpuws history` lists them)")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("history", "compare"))

    p = sub.add_parser("baseline", help="mark a run as a baseline")
    p.add_argument("run_id", help="a stored run (id or unique prefix; `gpuws history` lists "
                                  "them)")
    p.add_argument("--off", action="store_true", help="unmark it")
    p.set_defaults(func=_lazy("history", "baseline"))

    p = sub.add_parser("pull", help="pull a run's artifacts home (resumes)")
    add_connection_args(p)
    p.add_argument("run_id", help="a stored run (id or unique prefix; `gpuws history` lists "
                                  "them)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("pull", "pull"))

    p = sub.add_parser("trace", help="write a run's timeline as a Chrome/Perfetto trace file "
                                     "(from its pulled artifacts)")
    p.add_argument("run_id", help="a stored run (id or unique prefix; `gpuws history` lists "
                                  "them)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="file to write (.gz: gzipped; default RUN.trace.json.gz)")
    p.set_defaults(func=_lazy("trace", "trace"))

    p = sub.add_parser("mcp", help="serve gpuws's tools to a coding agent over the Model "
                                   "Context Protocol (stdio), bounded by the options below")
    p.add_argument("-F", dest="ssh_config", metavar="FILE",
                   help="ssh config file for the hosts the agent reaches")
    p.add_argument("--budget-usd", type=usd, metavar="USD",
                   help="the most this session may cost, all hosts together (each host's "
                        "rate × connected time); a run that could pass it is refused")
    p.add_argument("--max-run-seconds", type=_bounded(float, 1, 86400), default=600.0,
                   metavar="S", help="a run still going after this long is cancelled on the "
                                     "pod (default 600)")
    p.set_defaults(func=_mcp)
    return parser


async def _mcp(args: argparse.Namespace) -> int:
    """``gpuws mcp``: the MCP SDK (the mcp extra) is imported only by this command."""
    try:
        from .mcp.server import serve
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        raise UsageError("gpuws mcp needs the mcp extra, which is not installed",
                         remedy="pip install 'gpuws[mcp]' (scripts/run installs it)") from exc
    return await serve(args)


def _lazy(module: str, name: str) -> Command:
    async def run(args: argparse.Namespace) -> int:
        import importlib

        mod = importlib.import_module(f"gpuws.commands.{module}")
        fn: Command = getattr(mod, name)
        return int(await fn(args))
    return run


async def _run(args: argparse.Namespace) -> int:
    """``gpuws run``: one pod as always; several pods are a fleet (commands/fleet.py)."""
    return await _lazy("fleet" if args.more_pods else "run", "run")(args)


async def _export(args: argparse.Namespace) -> int:
    """``gpuws export SESSION`` or ``gpuws export --fleet ID``: exactly one of them."""
    if (args.session is None) == (args.fleet is None):
        raise UsageError("give a session id or --fleet ID (one of them)",
                         remedy="`gpuws sessions` lists the sessions, `gpuws fleets` the "
                                "fleets")
    return await _lazy("fleet" if args.fleet else "history", "export")(args)


def _tui(name: str) -> Command:
    async def run(args: argparse.Namespace) -> int:
        # Textual is imported here, only by the commands that open the TUI.
        from .tui import entry

        fn: Command = getattr(entry, name)
        return int(await fn(args))
    return run


def error_line(exc: GpuwsError) -> str:
    """The ``gpuws: …`` line a failed command prints on stderr.

    An error can quote the pod (an agent's refusal, its stderr): one line it stays, and
    no escape reaches the terminal.
    """
    # Imported here: most runs never fail, and the sanitiser brings Rich along.
    from .text.textsafe import visible

    return f"gpuws: {visible(exc.one_line(), None)}\n"


def unknown_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The ``gpuws: …`` line for a mistyped command (``gpuws doctr``), or ``None``.

    argparse's own answer lists every command in a usage block; a person who typed
    ``doctr`` wants to hear ``doctor``.
    """
    import difflib

    # argparse keeps its subcommands in a private action: there is no public accessor.
    commands = next((list(a.choices) for a in parser._actions
                     if isinstance(a, argparse._SubParsersAction)), [])
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] == "-F" else rest[1:]
    if not rest or rest[0] in commands:
        return None
    word = rest[0]
    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.6)
    hint = f"did you mean `gpuws {close[0]}`? " if close else ""
    from .text.textsafe import visible

    return (f"gpuws: Usage error: no command {visible(word, 60)!r} — {hint}"
            "`gpuws --help` lists the commands\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    typo = unknown_command(parser, sys.argv[1:] if argv is None else argv)
    if typo is not None:
        sys.stderr.write(typo)
        return UsageError.exit_code
    args = parser.parse_args(argv)
    # Imported once the arguments are read: asyncio brings ssl along, and `--help` or a
    # mistyped option needs neither.
    import asyncio

    try:
        code = int(asyncio.run(args.func(args)))
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
        return code
    except BrokenPipeError:
        # The reader left (`gpuws report FILE | head -5`): exit quietly like other Unix
        # tools. Python's docs (signal, "Note on SIGPIPE"): point stdout at devnull so the
        # flush at exit does not raise again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except GpuwsError as exc:
        sys.stderr.write(error_line(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("gpuws: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
