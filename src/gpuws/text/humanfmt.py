"""Numbers for people: short, with units, ``—`` for what is unknown.

The one place gpuws decides how a duration, a size, a price or a metric reads. The
headless commands (``doctor``, ``history``, ``sessions``) and the TUI's panes
(through ``gpuws.tui.fmt``) all print through it, so a figure reads the same in a
terminal table as in a pane. No Textual and no rich here: plain strings only.
"""

from __future__ import annotations

import time

DASH = "—"

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


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
    """A time given in milliseconds, in the unit that reads best (ns, µs, ms or s)."""
    if value is None:
        return DASH
    if abs(value) < 0.001:
        return f"{value * 1e6:.0f} ns"
    if abs(value) < 1.0:
        return f"{value * 1000:.1f} µs"
    if abs(value) < 1000.0:
        return f"{value:.3f} ms"
    return f"{value / 1000:.3f} s"


def size(n: float | None) -> str:
    """Bytes in binary units: ``512 B``, ``144.8 KiB``, ``23.5 GiB``."""
    if n is None:
        return DASH
    value = float(n)
    for unit in _BINARY_UNITS:
        if abs(value) < 1024 or unit == _BINARY_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def mib(value: float | None) -> str:
    """A size given in MiB (as nvidia-smi and /proc/meminfo report it): ``23.5 GiB``."""
    return DASH if value is None else size(value * 2**20)


def usd(value: float | None) -> str:
    """Dollars: ``$0.0042`` under a cent, ``$1.23`` above."""
    if value is None:
        return DASH
    return f"${value:.4f}" if abs(value) < 0.01 and value != 0 else f"${value:.2f}"


def pct(value: float | None, digits: int = 1) -> str:
    """A percentage given in percent: ``pct(1.5)`` is ``1.5%``."""
    return DASH if value is None else f"{value:.{digits}f}%"


def share(value: float | None, digits: int = 1) -> str:
    """A share given as a fraction, as a percentage: ``share(0.01)`` is ``1.0%``."""
    return DASH if value is None else pct(value * 100.0, digits)


def num(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A number with thousands separators and an optional unit."""
    if value is None:
        return DASH
    text = f"{value:,.{digits}f}"
    return f"{text} {unit}" if unit else text


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """A count with an SI prefix and ``digits`` significant digits: ``1.12 TFLOP``."""
    if value is None:
        return DASH
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def mhz(value: float | None) -> str:
    """A clock in MHz, whole (NVML reports whole MHz): ``1,980 MHz``."""
    return num(value, "MHz")


def watts(value: float | None) -> str:
    """Power: ``412 W``."""
    return num(value, "W")


def celsius(value: float | None) -> str:
    """A temperature: ``61 °C``."""
    return num(value, "°C")


def ratio(value: float | None, digits: int = 3) -> str:
    """A ratio: ``1.234×``."""
    return DASH if value is None else f"{value:.{digits}f}×"


def quantity(value: float | None, unit: str) -> str:
    """A reading in the unit telemetry gives it (``%``, ``MHz``, ``MiB``, ``W``, ``°C``)."""
    if unit == "%":
        return pct(value, 0)
    if unit == "MiB":
        return mib(value)
    return num(value, unit)


def when(ts: float | None) -> str:
    """A local date and time, to the minute."""
    if ts is None or not 0 <= ts < 4e9:  # a pod's word: nothing before 1970 or after 2096
        return DASH
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


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
        return f"{value:,.0f} FLOP/B" if abs(value) >= 100 else f"{value:.3g} FLOP/B"
    if key == "flops":
        return si(value, "FLOP")
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"
