"""Which GPU a run uses: ``--gpu`` checked on the laptop, and the pod's GPUs described.

A run targets one GPU by index (``--gpu 1``) or by UUID (``--gpu GPU-2a311d9d…``, any
unique prefix; ``MIG-…`` for a MIG instance). The form is checked here before anything
connects (:func:`check_syntax`); once the pod's probe is known, a GPU it does not have is
refused with the list of those it has (:func:`check_on_pod`), the same rule the agent
applies when it resolves :attr:`gpuws.protocol.RunSpec.gpu`. Everything the pod said
(names, process names) is made visible through :mod:`gpuws.text.textsafe` here, so every
face can print these lines as they are. No Textual and no Rich here.
"""

from __future__ import annotations

import re

from .. import protocol
from ..errors import UsageError
from ..text import humanfmt
from ..text.textsafe import visible
from .clocks import event_label

#: CUDA numbers at most 64 devices per process; an index beyond is a typo.
MAX_INDEX = 63
#: The valid forms, for every refusal.
FORMS = ("an index 0..63 (`gpuws doctor HOST` lists the pod's GPUs) or a UUID as "
         "nvidia-smi -L prints it: GPU-2a311d9d-… or MIG-… (a unique prefix is enough)")
_UUID = re.compile(r"(?i)(?P<kind>GPU-|MIG-(?:GPU-)?)(?P<rest>[0-9a-f][0-9a-f/-]*)")
_LONGEST = 96  # a MIG UUID of the old form (MIG-GPU-<uuid>/<gi>/<ci>) is 56 characters


def check_syntax(text: str | None) -> str | None:
    """``--gpu`` as typed, checked for its form (None: not given, CUDA picks).

    Raises:
        UsageError: neither an index 0..63 nor a ``GPU-``/``MIG-`` UUID (prefix).
    """
    if text is None:
        return None
    value = text.strip()
    if value.isdigit():
        if int(value) > MAX_INDEX:
            raise UsageError(f"--gpu {value}: there is no GPU index above {MAX_INDEX}",
                             remedy=f"give {FORMS}")
        return str(int(value))
    match = _UUID.fullmatch(value) if len(value) <= _LONGEST else None
    if match is not None:
        # As nvidia-smi prints them (GPU-/MIG- upper case, hex lower case), so the agent's
        # comparison and CUDA_VISIBLE_DEVICES see the one spelling.
        return match.group("kind").upper() + match.group("rest").lower()
    shown = visible(value, 60) or "''"
    if "," in value:
        raise UsageError(f"--gpu {shown}: a run uses one GPU",
                         remedy=f"give {FORMS}; for several GPUs start several runs")
    raise UsageError(f"--gpu {shown} is not a GPU index or UUID", remedy=f"give {FORMS}")


def find(probe: protocol.Probe, gpu: str) -> list[protocol.Gpu]:
    """The probe's GPUs that ``gpu`` (an index or a UUID prefix) names."""
    if gpu.isdigit():
        return [g for g in probe.gpus if g.index == int(gpu)]
    want = gpu.lower()
    return [g for g in probe.gpus if g.uuid and g.uuid.lower().startswith(want)]


def check_on_pod(gpu: str | None, probe: protocol.Probe) -> protocol.Gpu | None:
    """The pod's GPU that ``--gpu`` names, refusing one the pod does not have.

    A MIG instance is not among the probe's GPUs, so it is left for the agent to check.

    Returns:
        The GPU, or None when no ``--gpu`` was given (or it names a MIG instance).

    Raises:
        UsageError: the pod has no such GPU, or the UUID prefix names several.
    """
    if gpu is None or gpu.upper().startswith("MIG-"):
        return None
    if not probe.gpus:
        raise UsageError(f"--gpu {visible(gpu, 60)}: the pod has no GPU "
                         f"({visible(probe.gpu_error or 'none found', 200)})",
                         remedy="leave --gpu out, or run on a pod with an NVIDIA GPU")
    matches = find(probe, gpu)
    if len(matches) == 1:
        return matches[0]
    listing = "; ".join(f"{g.index} {visible(g.name, 60)} ({visible(g.uuid or 'no UUID', 60)})"
                        for g in probe.gpus)
    if matches:
        raise UsageError(f"--gpu {visible(gpu, 60)} names {len(matches)} GPUs of the pod",
                         remedy=f"give more of the UUID, or an index: {listing}")
    raise UsageError(f"--gpu {visible(gpu, 60)}: the pod has no such GPU",
                     remedy=f"the pod's GPUs: {listing}")


def processes(procs: list[protocol.GpuProcess] | None, limit: int = 4) -> str:
    """Who uses a GPU: ``pid 4242 python3 (20.1 GiB), …``; ``none``; ``not readable``."""
    if procs is None:
        return "not readable"
    if not procs:
        return "none"
    # NVML names a process by its full path; the last part is what people recognise.
    shown = [f"pid {p.pid} {visible(p.name.rstrip('/').rsplit('/', 1)[-1], 40) or '?'}"
             + (f" ({humanfmt.mib(p.used_mib)})" if p.used_mib is not None else "")
             for p in procs[:limit]]
    more = len(procs) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def label(index: int, name: str) -> str:
    """``GPU 1 (NVIDIA H200)``, the name made visible."""
    return f"GPU {index} ({visible(name, 60)})" if name else f"GPU {index}"


def busy_warning(target: protocol.GpuTarget) -> str | None:
    """One line naming who else uses the run's GPU, or None when nobody does."""
    if not target.busy:
        return None
    n = len(target.busy)
    return (f"{label(target.index, target.name)} is busy: {n} other process"
            f"{'es use' if n > 1 else ' uses'} it ({processes(target.busy)}); this run's "
            "figures may be slower and noisier — pick an idle GPU with --gpu "
            "(`gpuws doctor HOST` shows who uses each)")


def memory(g: protocol.Gpu) -> str:
    """``23.5 GiB / 140.4 GiB`` (used / total); ``140.4 GiB total`` when the use is unknown."""
    if g.memory_used_mib is None:
        return f"{humanfmt.mib(g.memory_total_mib)} total"
    return f"{humanfmt.mib(g.memory_used_mib)} / {humanfmt.mib(g.memory_total_mib)}"


def clocks(g: protocol.Gpu) -> str:
    """``SM 345 / 1,980 MHz``: now and the most it goes to."""
    now, top = g.sm_clock_mhz, g.sm_clock_max_mhz
    if now is None and top is None:
        return humanfmt.DASH
    return f"{humanfmt.num(now)} / {humanfmt.mhz(top)}"


def power(g: protocol.Gpu) -> str:
    """``126 W / 700 W`` (draw / limit)."""
    if g.power_w is None:
        return humanfmt.DASH
    if g.power_limit_w is None:
        return humanfmt.watts(g.power_w)
    return f"{humanfmt.num(g.power_w)} / {humanfmt.watts(g.power_limit_w)}"


def events(names: list[str]) -> str:
    """Clock-event reasons as people read them (``idle``, ``software power cap``)."""
    return ", ".join(event_label(e) for e in names) or "none"
