"""Which GPU a run uses, and pinning every tier of the run to it.

``RunSpec.gpu`` is what the person typed: an index (``"1"``, nvidia-smi's and NVML's
numbering, which is PCI bus order), a UUID (``"GPU-2a311d9d-…"``) or a unique prefix of
one. :func:`choose` resolves it against the pod's GPUs; :func:`pin` then sets the run's
environment once, and every tier's process inherits it:

- ``CUDA_VISIBLE_DEVICES=<uuid>`` (the index where NVML gave no UUID): the workload's
  Tier-1 child, nsys and its target, torch.profiler, ncu and its target all see exactly
  that GPU, as CUDA device 0. A UUID is used rather than an index because it names the
  same GPU whatever ``CUDA_DEVICE_ORDER`` a process ends up with.
- ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: CUDA's own default order is "fastest first", so on a
  box with mixed GPUs CUDA's device 1 need not be nvidia-smi's GPU 1. In PCI order they
  agree, which is what makes an index (pinned, inherited, or the default 0) mean the GPU
  nvidia-smi, NVML and ``gpuws doctor`` call by that number.
- ncu gets ``--devices 0`` (:data:`NCU_DEVICE_ARGS`), see there.

Without ``RunSpec.gpu`` nothing is pinned; :func:`choose` still says which GPU CUDA
will use (the first of an inherited ``CUDA_VISIBLE_DEVICES``, else index 0) where that
can be known, so ``RunStarted.gpu`` and the Tier-1 clocks name the right GPU.

Standard library only (runs on the pod's python3 >= 3.8).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional

#: ncu's ``--devices`` takes CUDA device ordinals as the profiled process enumerates
#: them, and CUDA numbers only the devices ``CUDA_VISIBLE_DEVICES`` leaves visible,
#: from 0 (Nsight Compute's filter examples: "--device 1 … launched on the CUDA device
#: with device ID 1"; CUDA's docs for CUDA_VISIBLE_DEVICES). A run pinned by
#: :func:`pin` shows its process one device, so the pinned GPU is device 0 there, never
#: its nvidia-smi index. Passing it anyway says so in the argv the export records, and
#: keeps ncu on that GPU if a workload widened its own CUDA_VISIBLE_DEVICES.
#: tests/gpu/test_gpu_pinning.py checks the report's device index and PCI bus id.
NCU_DEVICE_ARGS = ("--devices", "0")

#: Longest ``RunSpec.gpu`` taken (a UUID is 40 characters).
MAX_SPEC_CHARS = 80
_UUID_TEXT = re.compile(r"^(?:gpu-)?[0-9a-f-]*$")


class Choice(NamedTuple):
    """Which GPU a run uses.

    Attributes:
        gpu: The GPU (a ``protocol.Gpu``-shaped dict from the probe), or None when it
            cannot be known (no GPU, a MIG or unknown ``CUDA_VISIBLE_DEVICES`` entry).
        pinned: Whether the run asked for it (``RunSpec.gpu``) and gets it pinned.
        busy: Other processes on that GPU now (``protocol.GpuProcess``-shaped).
        error: Why ``RunSpec.gpu`` cannot be honoured (one line for people), else None.
        remedy: What to do about ``error``.
    """

    gpu: Optional[Dict[str, Any]]
    pinned: bool
    busy: List[Dict[str, Any]]
    error: Optional[str] = None
    remedy: str = ""


def describe(gpus: List[Dict[str, Any]]) -> str:
    """The GPUs one may pin to, in one line: ``0 = NVIDIA H200 (GPU-2a31…), 1 = …``."""
    return ", ".join("%s = %s (%s)" % (g.get("index"), g.get("name") or "GPU",
                                       g.get("uuid") or "no UUID") for g in gpus) or "none"


def resolve(wanted: str, gpus: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The GPU ``wanted`` names: an index, a UUID, or a unique prefix of a UUID.

    Raises:
        ValueError: No GPU or several match; the message is one line naming the choices.
    """
    text = wanted.strip()
    shown = visible_spec(text)
    if not text or len(text) > MAX_SPEC_CHARS or not text.isprintable():
        raise ValueError("--gpu %s is not a GPU index or UUID; this pod's GPUs: %s"
                         % (shown, describe(gpus)))
    if text.isdigit():
        found = [g for g in gpus if g.get("index") == int(text)]
        if found:
            return found[0]
        raise ValueError("there is no GPU %s on this pod; its GPUs: %s" % (shown, describe(gpus)))
    lowered = text.lower()
    if lowered.startswith("mig-"):
        raise ValueError("--gpu %s names a MIG instance; gpuws pins whole GPUs: %s"
                         % (shown, describe(gpus)))
    if not _UUID_TEXT.match(lowered):
        raise ValueError("--gpu %s is not a GPU index or UUID; this pod's GPUs: %s"
                         % (shown, describe(gpus)))
    exact = [g for g in gpus if str(g.get("uuid") or "").lower() == lowered]
    if exact:
        return exact[0]
    found = [g for g in gpus if _uuid_starts(str(g.get("uuid") or "").lower(), lowered)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError("no GPU on this pod has a UUID starting %s; its GPUs: %s"
                         % (shown, describe(gpus)))
    raise ValueError("--gpu %s matches %d GPUs (%s); give more of the UUID"
                     % (shown, len(found), describe(found)))


def _uuid_starts(uuid: str, prefix: str) -> bool:
    """Whether ``uuid`` (``gpu-…``) starts with ``prefix``, given with or without ``GPU-``."""
    if not uuid:
        return False
    return uuid.startswith(prefix) or (uuid.startswith("gpu-") and uuid[4:].startswith(prefix))


def visible_spec(text: str) -> str:
    """``text`` quoted for a message, control characters escaped and length bounded."""
    cut = text[:MAX_SPEC_CHARS]
    return repr(cut + ("…" if len(text) > MAX_SPEC_CHARS else ""))


def inherited(env: Dict[str, str], gpus: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The GPU CUDA uses as device 0 without pinning, or None when it cannot be told.

    That is the first entry of ``CUDA_VISIBLE_DEVICES`` (an index, or a UUID or UUID
    prefix, as CUDA accepts), else GPU 0. An index means PCI order only where
    ``CUDA_DEVICE_ORDER`` is (or will be set to) ``PCI_BUS_ID``; with another order on a
    box of several GPUs, and for MIG entries, the answer is None rather than a guess.
    """
    if not gpus:
        return None
    value = env.get("CUDA_VISIBLE_DEVICES")
    first = "0" if value is None else value.split(",")[0].strip()
    if not first:
        return None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    if first.isdigit():
        order = env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if order != "PCI_BUS_ID" and len(gpus) > 1:
            return None
        found = [g for g in gpus if g.get("index") == int(first)]
        return found[0] if found else None
    if not first.lower().startswith("gpu-"):
        return None
    try:
        return resolve(first, gpus)
    except ValueError:
        return None


def choose(wanted: Optional[str], env: Dict[str, str], gpus: List[Dict[str, Any]],
           gpu_error: Optional[str] = None) -> Choice:
    """Which GPU a run uses, from ``RunSpec.gpu`` (``wanted``), the run's environment and
    the probe's GPU list. Never raises: a GPU that does not exist is :attr:`Choice.error`.
    """
    if wanted is None or wanted == "":
        gpu = inherited(env, gpus)
        return Choice(gpu, False, others(gpu))
    if not gpus:
        why = gpu_error or "no NVIDIA GPU was found"
        return Choice(None, False, [], "--gpu %s asks for a GPU, and this pod has none (%s)"
                      % (visible_spec(wanted), why),
                      "run on a pod with an NVIDIA GPU and driver, or without --gpu")
    try:
        gpu = resolve(wanted, gpus)
    except ValueError as exc:
        return Choice(None, False, [], str(exc),
                      "pick one of those with --gpu INDEX or --gpu UUID (`gpuws doctor` "
                      "lists the pod's GPUs and who uses each)")
    return Choice(gpu, True, others(gpu))


def others(gpu: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The processes the probe saw on ``gpu`` (the agent's own already left out)."""
    if gpu is None:
        return []
    return [dict(p) for p in gpu.get("processes") or []]


def pin(env: Dict[str, str], choice: Choice) -> Optional[str]:
    """Set the run's environment for ``choice`` (see the module docstring).

    Returns:
        The ``CUDA_VISIBLE_DEVICES`` value pinning replaced, or None.
    """
    if not choice.pinned or choice.gpu is None:
        # Unpinned: only make an inherited or default index mean nvidia-smi's numbering,
        # unless the run set its own order.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return None
    old = env.get("CUDA_VISIBLE_DEVICES")
    env["CUDA_VISIBLE_DEVICES"] = str(choice.gpu.get("uuid") or choice.gpu["index"])
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return old if old is not None and old != env["CUDA_VISIBLE_DEVICES"] else None


def ncu_device_args(choice: Optional[Choice]) -> List[str]:
    """ncu's device filter for a run: :data:`NCU_DEVICE_ARGS` when pinned, else none."""
    return list(NCU_DEVICE_ARGS) if choice is not None and choice.pinned else []


def target_event(choice: Choice) -> Optional[Dict[str, Any]]:
    """``RunStarted.gpu`` (a ``protocol.GpuTarget`` dict), or None when not known."""
    gpu = choice.gpu
    if gpu is None:
        return None
    sms = gpu.get("sm_count")
    return {"index": int(gpu["index"]), "uuid": gpu.get("uuid"),
            "name": str(gpu.get("name") or ""), "busy": choice.busy,
            "sm_count": sms if isinstance(sms, int) and not isinstance(sms, bool) else None}


def busy_sentence(choice: Choice) -> str:
    """``GPU 0 (NVIDIA H200) is in use by 2 other processes: pid 4242 python (2,048 MiB),
    …`` — for the warning a busy GPU gets before the tiers start."""
    gpu = choice.gpu or {}
    parts = []
    for proc in choice.busy[:8]:
        name = str(proc.get("name") or "") or "(name not visible here)"
        used = proc.get("used_mib")
        mib = "" if used is None else " (%s MiB)" % format(round(float(used)), ",")
        parts.append("pid %s %s%s" % (proc.get("pid"), name[:64], mib))
    more = len(choice.busy) - len(parts)
    if more > 0:
        parts.append("and %d more" % more)
    return "GPU %s (%s) is in use by %d other process%s: %s" % (
        gpu.get("index"), gpu.get("name") or "GPU", len(choice.busy),
        "" if len(choice.busy) == 1 else "es", ", ".join(parts))
