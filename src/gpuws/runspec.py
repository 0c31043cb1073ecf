"""What a person chose for a run, turned into the ``RunSpec`` the pod receives.

``gpuws run`` (flags) and the TUI's run launcher (a form) both fill a
:class:`LaunchOptions` and call :func:`build_spec`, so a run started either way is
described by exactly the same spec.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import protocol
from .errors import UsageError


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """A run as a person specifies it (the defaults are ``gpuws run``'s).

    Attributes:
        workload: ``builtin:NAME[?k=v&...]``, ``file:PATH`` (a file on this machine) or
            ``cmd:COMMAND``.
        tiers: comma-separated tier numbers, e.g. ``"1,3"``.
        target_ci: stop Tier 1 when the median's 95% CI half-width is below this share.
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


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """The options ``gpuws run``'s flags hold (see ``commands.run.add_run_args``)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(LaunchOptions)
              if hasattr(args, f.name)}
    values["env"] = tuple(values.get("env") or ())
    return LaunchOptions(**values)


def _timing(value: str) -> Literal["auto", "cold", "hot"]:
    if value == "auto":
        return "auto"
    if value == "cold":
        return "cold"
    if value == "hot":
        return "hot"
    raise UsageError(f"unknown Tier 1 timing {value!r}", remedy="use auto, cold or hot")


def build_spec(opts: LaunchOptions) -> protocol.RunSpec:
    """Check the options and build the run's spec.

    A ``file:`` workload is read here and travels inside the spec, so the pod's run
    directory is self-contained.

    Raises:
        UsageError: an unknown workload kind, an unreadable file, bad tiers or env items.
    """
    workload = opts.workload
    file_name = file_b64 = None
    if workload.startswith("file:"):
        path = Path(workload[5:]).expanduser()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the workload file {path}: {exc.strerror}",
                             remedy="check the path after file:") from exc
        file_name, file_b64 = path.name, base64.b64encode(data).decode()
        workload = f"file:{path.name}"
    elif not workload.startswith(("builtin:", "cmd:")):
        raise UsageError(f"unknown workload {workload!r}",
                         remedy="use builtin:NAME, file:PATH or cmd:COMMAND")
    try:
        tiers = sorted({int(t) for t in opts.tiers.split(",") if t.strip()})
    except ValueError as exc:
        raise UsageError(f"bad --tiers {opts.tiers!r}", remedy="e.g. --tiers 1,3") from exc
    env = {}
    for item in opts.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"bad --env {item!r}", remedy="use --env KEY=VALUE")
        env[key] = value
    return protocol.RunSpec(
        workload=workload, tiers=tiers, target_ci=opts.target_ci, max_seconds=opts.max_seconds,
        min_samples=opts.min_samples, warmup=opts.warmup,
        timing=_timing(opts.timing),
        kernel_regex=opts.kernel_regex, launch_skip=opts.launch_skip,
        launch_count=opts.launch_count, ncu_set=opts.ncu_set,
        ncu_sections=opts.ncu_sections.split(",") if opts.ncu_sections else None,
        replay_mode=opts.replay_mode, clock_control=opts.clock_control,
        cache_control=opts.cache_control, ncu_path=opts.ncu_path, file_name=file_name,
        file_b64=file_b64, env=env, timeout_s=opts.timeout, install_cupy=opts.install_cupy,
        profile_iters=opts.profile_iters)
