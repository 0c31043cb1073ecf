"""Numbers as the panes print them: the shared formatter, under the name the widgets use.

Everything here is :mod:`gpuws.text.humanfmt`, so a figure reads the same in a pane as in
``gpuws doctor`` or ``gpuws history``; this module only keeps the short import path.
"""

from __future__ import annotations

from ..text.humanfmt import (
    DASH,
    celsius,
    duration,
    metric,
    mhz,
    mib,
    ms,
    num,
    pct,
    quantity,
    ratio,
    share,
    si,
    size,
    usd,
    watts,
    when,
)

__all__ = ["DASH", "celsius", "duration", "metric", "mhz", "mib", "ms", "num", "pct",
           "quantity", "ratio", "share", "si", "size", "usd", "watts", "when"]
