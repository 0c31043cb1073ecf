"""Kernel families for pictures of a run: the one classifier the TUI and the export share.

The program verdict already groups kernel time by family
(:func:`gpuws.remote_agent.verdicts.program.family`, bundled with the agent); a picture
that coloured blocks by a second classifier could call a kernel "elementwise" beside a
verdict that counted it as "normalisation". So this module adds no rules of its own: it
asks the verdict's classifier, and adds what a picture needs besides, the order of a
legend, a colour per family, and the GPU event's category (a trace's ``memcpy``/``memset``
events are copies whatever their name says).

Pure and standard library only, so every face can import it.
"""

from __future__ import annotations

from functools import lru_cache

from ..remote_agent.verdicts.program import FAMILIES
from ..remote_agent.verdicts.program import family as _verdict_family

#: Every family a block can have, in legend order (the verdict's families, then "other").
FAMILY_ORDER: tuple[str, ...] = (*(name for name, _ in FAMILIES), "other")

#: One colour per family: the Okabe-Ito palette (told apart with the common colour-vision
#: deficiencies), so TUI and export draw a family alike.
FAMILY_COLOURS: dict[str, str] = {
    "communication": "#CC79A7",
    "attention": "#D55E00",
    "copy/memset": "#F0E442",
    "normalisation": "#56B4E9",
    "GEMM": "#0072B2",
    "reduction": "#009E73",
    "elementwise": "#E69F00",
    "other": "#999999",
}

#: Trace event categories that are copies or fills by what the GPU did, not by name
#: (``timeline_trace`` writes ``memcpy``/``memset``; torch writes ``gpu_memcpy``/…).
_COPY_CATEGORIES = frozenset({"memcpy", "memset", "gpu_memcpy", "gpu_memset"})


# A timeline names the same few hundred kernels over and over (10^5 events of a trace
# are ~10^2 distinct names); the classifier tests dozens of substrings per call.
@lru_cache(maxsize=8192)
def kernel_family(name: str, category: str = "") -> str:
    """The family of one GPU event: ``category`` (a trace's ``cat``) first where it says
    copy or fill, else the verdict's classifier on the full ``name``. Always one of
    :data:`FAMILY_ORDER`."""
    if category.lower() in _COPY_CATEGORIES:
        return "copy/memset"
    return _verdict_family(name)
