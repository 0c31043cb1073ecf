"""What a person chose for a run, checked here and turned into the ``RunSpec`` the pod receives.

``gpuws run`` (flags) and the TUI's run launcher (a form) both fill a
:class:`LaunchOptions` and call :func:`build_spec`, so a run started either way is
described by exactly the same spec and refused for exactly the same mistakes. Everything
that can be checked on this machine is checked before connecting (the workload, a
builtin's parameters and their types, the tiers, the numbers, options that only a tier
not chosen would use): each mistake is one :class:`~gpuws.errors.UsageError` (exit 2)
whose remedy lists what would have been valid.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import protocol
from .errors import StoreError, UsageError
from .gpu.gpus import check_syntax as check_gpu_syntax
from .kernels.registry import WorkloadError, validate
from .text.textsafe import visible


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """A run as a person specifies it (the defaults are ``gpuws run``'s).

    Attributes:
        workload: ``builtin:NAME[?k=v&...]``, ``file:PATH`` (a file on this machine) or
            ``cmd:COMMAND``.
        tiers: comma-separated tier numbers, e.g. ``"1,3"``.
        target_ci: stop Tier 1 when the median's 95% CI half-width is below this share
            of the median (``0.01`` is 1%; :func:`parse_target_ci` reads ``1%``).
        max_seconds: Tier 1's sampling time budget.
        min_samples: Tier 1's fewest samples.
        warmup: Tier 1's warm-up calls.
        timing: Tier 1's mode: ``auto`` (cold for calls of 10 µs and more, hot in batches
            below), ``cold`` (L2 flushed clean and 1 ms idle before every sample, as ncu
            measures) or ``hot`` (back to back).
        kernel_regex: the kernels Tier 3 profiles (default: Tier 2's top kernel).
        launch_skip: launches of a matching kernel to skip before profiling.
        launch_count: launches to profile.
        ncu_set: a section set from ``ncu --list-sets`` instead of the focused default.
        ncu_sections: comma-separated section identifiers.
        replay_mode: ncu's ``--replay-mode``.
        clock_control: ncu's ``--clock-control`` (``none`` keeps the clocks Tier 1 saw).
        cache_control: ncu's ``--cache-control``.
        ncu_path: an ncu to use instead of the selected one.
        profile_iters: workload calls per profiled process (Tiers 2 and 3).
        timeout: kill a workload process after this many seconds.
        install_cupy: install the CuPy wheel that fits the driver when the pod has none.
        env: ``KEY=VALUE`` items for the workload's environment.
        gpu: the GPU to run on, an index or a ``GPU-``/``MIG-`` UUID (prefix); None lets
            CUDA pick (:func:`gpuws.gpu.gpus.check_syntax` says what is valid).
        workspace: a project directory on this machine, synced to the pod before the run
            (:mod:`gpuws.workspace`); the run executes in it, and ``file:PATH`` is a path
            inside it.
        max_tier3_seconds: stop Tier 3 before ncu starts when its estimate exceeds this
            many seconds; None: no budget.
        rank: the rank whose process Tier 3 profiles, where the command starts several
            (``torchrun``, ``mpirun``); None: rank 0 where Tier 2 saw ranks.
    """

    workload: str
    tiers: str = "1,2,3"
    target_ci: float = 0.01
    max_seconds: float = 10.0
    min_samples: int = 10
    warmup: int = 5
    timing: str = "auto"
    kernel_regex: str | None = None
    launch_skip: int = 0
    launch_count: int = 1
    ncu_set: str | None = None
    ncu_sections: str | None = None
    replay_mode: str | None = None
    clock_control: str = "none"
    cache_control: str = "all"
    ncu_path: str | None = None
    profile_iters: int = 10
    timeout: float | None = None
    install_cupy: bool = False
    env: tuple[str, ...] = ()
    gpu: str | None = None
    workspace: str | None = None
    max_tier3_seconds: float | None = None
    rank: int | None = None


TIERS = (1, 2, 3)
TIMINGS = ("auto", "cold", "hot")

#: Options only Tier 1 uses, and only Tier 3 uses: set away from their defaults while
#: that tier is not chosen, they would be ignored without a word, so they are refused.
TIER1_ONLY = {"target_ci": "--target-ci", "max_seconds": "--max-seconds",
              "min_samples": "--min-samples", "warmup": "--warmup", "timing": "--cold/--hot"}
TIER3_ONLY = {"kernel_regex": "--kernel-regex", "launch_skip": "--launch-skip",
              "launch_count": "--launch-count", "ncu_set": "--ncu-set",
              "ncu_sections": "--ncu-sections", "replay_mode": "--replay-mode",
              "cache_control": "--cache-control", "max_tier3_seconds": "--max-tier3-seconds",
              "rank": "--rank"}


def parse_target_ci(text: str | float) -> float:
    """Tier 1's CI target as people write it, as the share the pod uses.

    ``1%`` (and ``1 %``) is one percent; a bare number below 1 is a share (``0.01``),
    as ``--target-ci`` always took it, so existing scripts keep their meaning. A bare
    number of 1 or more is refused rather than guessed: it would be a CI of 100% or more
    as a share, yet ``2`` most likely meant 2%.

    Args:
        text: what was typed (or a number already parsed).

    Returns:
        The share, strictly between 0 and 1.

    Raises:
        UsageError: not a number, not positive, or ambiguous.
    """
    raw = str(text).strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1].strip() if percent else raw)
    except ValueError:
        raise UsageError(f"the Tier-1 CI target {raw!r} is not a number",
                         remedy="write a percentage such as 1% (or the share 0.01)") from None
    share = value / 100.0 if percent else value
    if not math.isfinite(share) or share <= 0:
        raise UsageError(f"the Tier-1 CI target {raw} must be above 0",
                         remedy="e.g. 1% (stop at ±1% of the median)")
    if share >= 1:
        hint = f"{value:g}%" if not percent else "a percentage below 100%"
        raise UsageError(
            f"the Tier-1 CI target {raw} would be a CI of {share * 100:g}% of the median",
            remedy=f"write {hint} (with the % sign), or a share below 1 such as 0.01 for 1%")
    return share


#: An environment variable's name, as POSIX shells accept it.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The largest ``--env-file`` read (a secrets file, not a data set).
MAX_ENV_FILE_BYTES = 1 << 20


def resolve_env(files: list[str], items: tuple[str, ...]) -> tuple[str, ...]:
    """The workload's environment as ``KEY=VALUE`` items, from ``--env-file`` and ``--env``.

    ``--env KEY`` (no ``=``) takes the value from this process's environment, and
    ``--env-file FILE`` reads ``KEY=VALUE`` lines (blank lines, ``#`` comments, an
    ``export`` prefix and one pair of surrounding quotes allowed): either way a secret
    stays out of the laptop's process list, where ``--env KEY=VALUE`` shows it to every
    user of the machine. Files come first, in order; ``--env`` items override them.

    Raises:
        UsageError: a file missing, a folder, too large or not UTF-8; a malformed line
            (its file and line number); ``--env KEY`` with KEY unset or not a name.
    """
    out: dict[str, str] = {}
    for name in files:
        out.update(_env_file(Path(name)))
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            if not _ENV_NAME.fullmatch(key):
                raise UsageError(f"bad --env {visible(item, 80)!r}",
                                 remedy="use --env KEY=VALUE, or --env KEY to pass KEY's value "
                                        "from this shell")
            if key not in os.environ:
                raise UsageError(f"--env {key}: {key} is not set in this shell's environment",
                                 remedy=f"export {key}=… first, or give --env {key}=VALUE or "
                                        "--env-file FILE")
            value = os.environ[key]
        out[key] = value
    return tuple(f"{k}={v}" for k, v in out.items())


def _env_file(path: Path) -> dict[str, str]:
    shown = visible(str(path), 200)
    try:
        st = path.stat()
    except OSError:
        raise UsageError(f"--env-file {shown}: no such file",
                         remedy="give a file of KEY=VALUE lines") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"--env-file {shown} is not a regular file",
                         remedy="give a file of KEY=VALUE lines")
    if st.st_size > MAX_ENV_FILE_BYTES:
        raise UsageError(f"--env-file {shown} is {st.st_size:,} bytes, over the "
                         f"{MAX_ENV_FILE_BYTES:,} an environment file may be",
                         remedy="give a file of KEY=VALUE lines")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--env-file {shown} is not UTF-8 text",
                         remedy="give a file of KEY=VALUE lines") from None
    except OSError as exc:
        raise UsageError(f"--env-file {shown}: {exc.strerror}",
                         remedy="check the file's permissions") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _ENV_NAME.fullmatch(key):
            # The line itself is not repeated: it may hold a secret.
            raise UsageError(f"--env-file {shown}, line {number}: not KEY=VALUE",
                             remedy="write one KEY=VALUE per line (# starts a comment)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """The options ``gpuws run``'s flags hold (see ``commands.common.add_run_args``).

    Also checks the flags that only the command line has, before anything connects:
    ``--fail-if-slower`` needs ``--baseline``, a detached run is never compared, and the
    baseline must be a run in the store.

    Raises:
        UsageError: a combination of flags that cannot work.
            ``--baseline`` naming no stored run is one too (the remedy says how to find one).
    """
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(LaunchOptions)
              if hasattr(args, f.name)}
    values["env"] = resolve_env(getattr(args, "env_file", None) or [],
                                tuple(values.get("env") or ()))
    if "target_ci" in values:
        values["target_ci"] = parse_target_ci(values["target_ci"])
    baseline = getattr(args, "baseline", None)
    fail_if_slower = getattr(args, "fail_if_slower", None)
    if fail_if_slower is not None:
        if not baseline:
            raise UsageError("--fail-if-slower needs --baseline RUN_ID",
                             remedy="`gpuws history` lists the stored runs and their ids")
        if not math.isfinite(fail_if_slower) or fail_if_slower < 0:
            raise UsageError(f"--fail-if-slower {fail_if_slower:g} must be a percentage of "
                             "0 or more", remedy="e.g. --fail-if-slower 3 (3% slower)")
    if getattr(args, "detach", False) and baseline:
        raise UsageError("--detach returns before the run ends, so --baseline cannot compare",
                         remedy="drop --detach, or compare later: gpuws compare BASELINE RUN")
    if baseline:
        check_stored_run(baseline, "--baseline")
    return LaunchOptions(**values)


def check_stored_run(run_id: str, what: str) -> str:
    """The full id of a stored run, refusing an unknown one before anything connects.

    Args:
        run_id: an id or unique prefix, as typed.
        what: the option that named it, for the message.

    Raises:
        UsageError: no stored run (or more than one) matches; the remedy points to
            ``gpuws history``.
        StoreError: the store cannot be opened.
    """
    # The store is opened only when a flag names a run (it creates its file if missing).
    from .sessions.runlist import RUN_LISTING_REMEDY
    from .sessions.store import Store

    with Store() as store:
        try:
            return store.run(run_id).run_id
        except StoreError as exc:
            raise UsageError(f"{what}: {exc.message}", remedy=RUN_LISTING_REMEDY) from None


def _timing(value: str) -> Literal["auto", "cold", "hot"]:
    if value == "auto":
        return "auto"
    if value == "cold":
        return "cold"
    if value == "hot":
        return "hot"
    raise UsageError(f"unknown Tier 1 timing {value!r}", remedy="use auto, cold or hot")


def _tiers(text: str) -> list[int]:
    tiers: set[int] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            tier = int(item)
        except ValueError:
            tier = 0
        if tier not in TIERS:
            raise UsageError(f"--tiers {text!r}: there is no tier {item.strip()!r}",
                             remedy="choose from 1 (CUDA events), 2 (kernel timeline), "
                                    "3 (Nsight Compute), e.g. --tiers 1,3")
        tiers.add(tier)
    if not tiers:
        raise UsageError("no tier chosen", remedy="choose from 1, 2, 3, e.g. --tiers 1,3")
    return sorted(tiers)


def _check_numbers(opts: LaunchOptions) -> None:
    """Counts and times in range: the pod would refuse them only after connecting."""
    parse_target_ci(opts.target_ci)  # the same rules for the share a form or caller passes
    checks: list[tuple[str, float | None, float, bool]] = [
        # flag, value, lowest allowed, whether the lowest itself is allowed
        ("--max-seconds", opts.max_seconds, 0, False),
        ("--min-samples", opts.min_samples, 1, True),
        ("--warmup", opts.warmup, 0, True),
        ("--launch-skip", opts.launch_skip, 0, True),
        ("--launch-count", opts.launch_count, 1, True),
        ("--profile-iters", opts.profile_iters, 1, True),
        ("--timeout", opts.timeout, 0, False),
        ("--max-tier3-seconds", opts.max_tier3_seconds, 0, False),
        ("--rank", opts.rank, 0, True),
    ]
    for flag, value, lowest, inclusive in checks:
        if value is None:
            continue
        ok = math.isfinite(value) and (value >= lowest if inclusive else value > lowest)
        if not ok:
            bound = f"at least {lowest:g}" if inclusive else f"above {lowest:g}"
            raise UsageError(f"{flag} {value:g} must be {bound}")


def _check_tier_options(opts: LaunchOptions, tiers: list[int]) -> None:
    """Refuse options that only a tier not chosen would use (they would do nothing)."""
    defaults = LaunchOptions(workload=opts.workload)
    for tier, options in ((1, TIER1_ONLY), (3, TIER3_ONLY)):
        if tier in tiers:
            continue
        given = [flag for name, flag in options.items()
                 if getattr(opts, name) != getattr(defaults, name)]
        if given:
            chosen = ",".join(str(t) for t in tiers)
            raise UsageError(
                f"{', '.join(given)} only affect{'s' if len(given) == 1 else ''} Tier {tier}, "
                f"which is not among the tiers chosen ({chosen})",
                remedy=f"add {tier} to the tiers, or leave {' and '.join(given)} out")


def _check_regex(regex: str | None) -> None:
    if not regex:
        return
    # ncu takes an optional "regex:" prefix; the rest must at least be a regular
    # expression (ncu's own dialect is close to Python's for everything people write).
    pattern = regex.removeprefix("regex:")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--kernel-regex {regex!r} is not a regular expression: {exc}",
                         remedy="e.g. --kernel-regex 'saxpy|gemm'") from None


def _workload(text: str, workspace: Path | None = None) -> tuple[str, str | None, str | None]:
    """The spec's workload string, and a ``file:`` workload's name and base64 content
    (none in a workspace: the file is one of its files, named by its path inside it)."""
    try:
        ref = validate(text)
    except WorkloadError as exc:
        raise UsageError(exc.problem, remedy=exc.valid or
                         "use builtin:NAME[?k=v&...], file:PATH or cmd:COMMAND") from None
    if ref.kind != "file":
        return text, None, None
    if workspace is not None:
        rel = _inside(workspace, ref.target)
        return f"file:{rel}", rel, None
    path = Path(ref.target).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the workload file {path}: {exc.strerror or exc}",
                         remedy="check the path after file: (it is a file on this machine, "
                                "sent to the pod with the run)") from exc
    return f"file:{path.name}", path.name, base64.b64encode(data).decode()


def _inside(root: Path, target: str) -> str:
    """``file:PATH`` in a workspace: PATH relative to the workspace (as typed, or as a
    path on this machine that lies inside it), refused when it is not a file there."""
    given = Path(target).expanduser()
    # Inside the workspace first (-W proj -w file:bench/x.py), then from here
    # (-W proj -w file:proj/bench/x.py).
    tries = [given] if given.is_absolute() else [root / given, given]
    found = [p.resolve() for p in tries if p.resolve().is_file()]
    path = found[0] if found else tries[0].resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise UsageError(f"file:{target} is not a file inside the workspace {root}",
                         remedy="give the benchmark's path inside the -W directory, e.g. "
                                "-w file:bench/attn.py -W .")
    return path.relative_to(root).as_posix()


def workspace_of(opts: LaunchOptions) -> tuple[Path, str] | None:
    """The workspace's directory (resolved) and its name on the pod, or None."""
    if opts.workspace is None:
        return None
    from .workspace.sync import workspace_name

    root = Path(opts.workspace).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"-W {opts.workspace}: not a directory",
                         remedy="give -W the project's directory, e.g. -W .")
    return root, workspace_name(root)


def build_spec(opts: LaunchOptions) -> protocol.RunSpec:
    """Check the options and build the run's spec.

    A ``file:`` workload is read here and travels inside the spec, so the pod's run
    directory is self-contained.

    Raises:
        UsageError: an unknown workload or builtin, a bad builtin parameter, an unreadable
            file, tiers other than 1, 2, 3, a number out of range, an option for a tier
            not chosen, a bad regex or env item, a ``gpu`` that is neither an index nor a
            UUID. The remedy lists what is valid.
    """
    ws = workspace_of(opts)
    workload, file_name, file_b64 = _workload(opts.workload, ws[0] if ws else None)
    gpu = check_gpu_syntax(opts.gpu)
    tiers = _tiers(opts.tiers)
    timing = _timing(opts.timing)
    _check_numbers(opts)
    _check_tier_options(opts, tiers)
    _check_regex(opts.kernel_regex)
    env: dict[str, str] = {}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"bad --env {item!r}", remedy="use --env KEY=VALUE")
        env[key] = value
    sections = [s.strip() for s in opts.ncu_sections.split(",") if s.strip()] \
        if opts.ncu_sections else None
    return protocol.RunSpec(
        workload=workload, tiers=tiers, target_ci=opts.target_ci, max_seconds=opts.max_seconds,
        min_samples=opts.min_samples, warmup=opts.warmup, timing=timing,
        kernel_regex=opts.kernel_regex, launch_skip=opts.launch_skip,
        launch_count=opts.launch_count, ncu_set=opts.ncu_set,
        ncu_sections=sections or None,
        replay_mode=opts.replay_mode, clock_control=opts.clock_control,
        cache_control=opts.cache_control, ncu_path=opts.ncu_path, file_name=file_name,
        file_b64=file_b64, env=env, timeout_s=opts.timeout, install_cupy=opts.install_cupy,
        profile_iters=opts.profile_iters, gpu=gpu, workspace=ws[1] if ws else None,
        max_tier3_s=opts.max_tier3_seconds, rank=opts.rank)
