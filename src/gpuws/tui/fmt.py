"""Numbers as the panes print them: short, with units, ``—`` for what is unknown."""

from __future__ import annotations

import time

DASH = "—"


def duration(seconds: float | None) -> str:
    """``420.0 ms``, ``4.20 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds is None:
        return DASH
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def ms(value: float | None) -> str:
    """A time given in milliseconds, in the unit that reads best."""
    if value is None:
        return DASH
    if value < 1.0:
        return f"{value * 1000:.1f} µs"
    if value < 1000.0:
        return f"{value:.3f} ms"
    return f"{value / 1000:.3f} s"


def size(n: int | float | None) -> str:
    """Bytes in binary units (``144.8 KiB``)."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def usd(value: float | None) -> str:
    """Dollars: ``$0.0042`` under a cent, ``$1.23`` above."""
    if value is None:
        return DASH
    return f"${value:.4f}" if abs(value) < 0.01 and value != 0 else f"${value:.2f}"


def pct(value: float | None, digits: int = 1) -> str:
    """A percentage."""
    return DASH if value is None else f"{value:.{digits}f}%"


def num(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A number with an optional unit."""
    if value is None:
        return DASH
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}" if unit else text


def when(ts: float | None) -> str:
    """A local date and time, to the minute."""
    return DASH if ts is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def metric(key: str, value: float | None) -> str:
    """A canonical ncu metric, formatted by what its key says it is."""
    if value is None:
        return DASH
    if key.endswith("_ns"):
        return ms(value / 1e6)
    if key.endswith("_pct"):
        return f"{value:.1f}%"
    if key.endswith("_bytes") or key == "shared_mem_per_block":
        return size(value)
    if key == "arithmetic_intensity":
        return f"{value:.3f} FLOP/B"
    if key == "flops":
        return f"{value:.3g}"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"
