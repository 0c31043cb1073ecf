"""What a real ``nsys profile`` said, in words: the failures seen on real machines.

Strings are those Nsight Systems 2023.4.4 printed on an H100 with the CUDA 13 driver
(``tests/fixtures/nsys-2023.4.4-h100``, recorded by ``tests/gpu/nsys_probe.sh``):

* a capture with no importer: ``Importer error status: An unknown error occurred.`` then
  ``Unable to retrieve the importer version: skipping importation of the QDSTRM file.``;
  only a ``.qdstrm`` is left (the host part, ``QdstrmImporter``, is missing or cannot
  load its libraries);
* a program whose CUDA is newer than the nsys: ``Importation succeeded with non-fatal
  errors.``, ``**** Analysis failed with: Status: TargetProfilingFailed`` and ``Unknown
  runtime API function index: 468``; a report comes out but holds a fraction of the
  kernels (1 of 60 for a torch cu130 forward), so its table must not be shown as the
  program's.

Standard library only: this module ships in the pod agent's bundle.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Dict, List, Optional, Tuple

from ..safefiles import read_json_dict, write_json_best_effort

_NO_IMPORTER = ("Unable to retrieve the importer version", "skipping importation of the QDSTRM")
_PARTIAL = ("Importation succeeded with non-fatal errors", "Analysis failed with",
            "TargetProfilingFailed")
_UNKNOWN_API = re.compile(r"Unknown (?:runtime|driver) API function index: (\d+)")
_CUPTI = re.compile(r"libcupti\.so\.(\d+)\.(\d+)$")


def nsys_cupti(nsys: str) -> Optional[Tuple[int, int]]:
    """The newest CUDA release whose CUPTI an nsys install carries (``(12, 4)``), or None.

    nsys traces through the CUPTI it ships beside its CLI (``target-linux-x64/
    libcupti.so.12.4``); a program built for a newer CUDA may call runtime functions that
    CUPTI cannot name. Read from the install itself, so nothing is assumed of its version.
    """
    where = os.path.dirname(os.path.realpath(nsys))
    best: Optional[Tuple[int, int]] = None
    for path in glob.glob(os.path.join(where, "libcupti.so.*")):
        m = _CUPTI.search(os.path.basename(path))
        if m is not None:
            found = (int(m.group(1)), int(m.group(2)))
            best = found if best is None or found > best else best
    return best


def cuda_text(version: Optional[Tuple[int, int]]) -> str:
    return "%d.%d" % version if version is not None else "unknown"


def diagnose(output: str, nsys_version: Optional[str], cupti: Optional[Tuple[int, int]],
             program_cuda: Optional[str]) -> Optional[str]:
    """One line saying why this nsys run cannot be trusted, or None when nothing says so.

    Args:
        output: What ``nsys profile`` printed (stdout and stderr; its end is enough).
        nsys_version: ``2023.4.4`` (from the inventory), for the message.
        cupti: :func:`nsys_cupti` of the install.
        program_cuda: The CUDA the workload was built for (torch's or CuPy's, as the
            probe read it), or None.
    """
    who = "nsys %s (CUPTI for CUDA %s)" % (nsys_version or "?", cuda_text(cupti))
    if any(s in output for s in _NO_IMPORTER):
        return ("%s captured the run but its importer (QdstrmImporter, Nsight Systems' host "
                "part) did not start, so only a .qdstrm came out; install the full "
                "nsight-systems package (or `gpuws doctor HOST --install-nsys`)" % who)
    m = _UNKNOWN_API.search(output)
    if m is not None or any(s in output for s in _PARTIAL):
        what = ("runtime API function %s is unknown to it" % m.group(1) if m is not None
                else "its importer reported errors")
        newer = (" this program's CUDA %s is newer;" % program_cuda
                 if program_cuda else "")
        return ("%s traced this run only in part (%s):%s its table would miss kernels, "
                "so Tier 2 falls back; an nsys from a CUDA release at least as new as the "
                "program's traces it whole" % (who, what, newer))
    return None


# ------------------------------------------------------------------- what was learnt
# A partial trace is only seen after a whole nsys pass (9-12 s for a small torch forward on
# the H100). The pod remembers it, per nsys install and workload (with the CUDA its Python
# packages were built for), so the next run of it there does not pay for it again: the
# inventory learns what each nsys can trace. Per workload, not per CUDA: the same nsys
# traced a CuPy program of that CUDA whole.


def workload_key(workload: str, program_cuda: Optional[str]) -> str:
    """A short, fixed-size name for a workload on this pod (its text may be long)."""
    return hashlib.sha256(("%s\n%s" % (program_cuda, workload)).encode()).hexdigest()[:24]

def _learnt_path(cache: str) -> str:
    return os.path.join(cache, "nsys_partial.json")


def learnt(cache: str) -> Dict[str, List[str]]:
    """``{nsys path: [workload keys it traced only in part]}`` (empty if none)."""
    data = read_json_dict(_learnt_path(cache))
    return {str(k): [str(c) for c in v] for k, v in data.items()
            if isinstance(v, list)}


#: Workloads remembered per install, newest last (the oldest is forgotten first).
MAX_LEARNT = 256


def remember_partial(cache: str, nsys: str, key: str) -> None:
    """Record that ``nsys`` traced the workload of :func:`workload_key` ``key`` in part."""
    data = learnt(cache)
    seen = data.setdefault(nsys, [])
    if key in seen:
        return
    seen.append(key)
    del seen[:-MAX_LEARNT]
    # A full or read-only cache only costs the next run a retry.
    write_json_best_effort(_learnt_path(cache), dict(data))
