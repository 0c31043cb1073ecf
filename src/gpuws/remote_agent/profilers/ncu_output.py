"""Reading ncu's console as it arrives: pass progress, errors, and what they mean.

ncu writes ``==PROF== Profiling "name": 0%....50%....100% - 38 passes`` a few characters
at a time while it replays a kernel, so :class:`NcuConsoleParser` is fed raw chunks and
reports progress on the partial line, not only on whole lines. It also recognises the
outcomes a person must be told about: counters blocked (``ERR_NVGPUCTRPERM``), a driver
too old for this ncu, no kernel matching the filter (with the kernels that did run and a
regex that would match them), metrics the GPU cannot give, the report path, and any
other ``==ERROR==``/``==WARNING==`` line.

Every item the parser returns is a dict with a ``kind`` key:

- ``progress``: ``kernel``, ``launch`` (ncu's result id or None), ``percent`` (0–100),
  ``passes`` (int once known), ``done`` (bool). :func:`progress_event` shapes it as the
  ``protocol.NcuProgress`` event.
- ``connected`` / ``disconnected``: ``pid``, ``process``.
- ``report``: ``path``.
- ``perm_error``: ``message``, ``url`` (counters are restricted to admin users).
- ``driver_incompatible``: ``message`` (step back one ncu release).
- ``profiler_unavailable``: ``message`` (ncu's profiler could not start at all: "Failed to
  initialize the profiler: LibraryNotLoaded", seen in gVisor-sandboxed containers).
- ``no_kernels``: ``kernels`` (names ncu listed), ``suggested_regex`` (str or None).
- ``unavailable_metrics``: ``count``, ``metrics``.
- ``error`` / ``warning``: ``message`` (the line without its ``==ERROR==`` prefix).

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["NcuConsoleParser", "progress_event", "regex_escape", "suggest_regex"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The name is greedy so that a demangled name holding ``": `` still ends at the last one.
_PROFILING = re.compile(
    r'^==PROF== Profiling "(?P<name>.*)"(?: - (?P<id>\d+))?: (?P<bar>[0-9%.]*)'
    r"(?: - (?P<passes>\d+) pass(?:es)?)?\s*$"
)
# The rest of a progress line that something else interrupted: on a long kernel ncu may
# print a ``==WARNING==`` line ("Launching the workload is taking more time than
# expected") in the middle of the bar, and the bar goes on on the next line.
_CONTINUED = re.compile(r"^(?P<bar>[0-9%.]+)(?: - (?P<passes>\d+) pass(?:es)?)?\s*$")
_CONNECTED = re.compile(r"^==PROF== Connected to process (?P<pid>\d+)(?: \((?P<proc>.*)\))?")
_DISCONNECTED = re.compile(r"^==PROF== Disconnected from process (?P<pid>\d+)")
_REPORT = re.compile(r"^==PROF== Report: (?P<path>.+?)\s*$")
_UNAVAILABLE = re.compile(
    r"Unable to access the following (?P<count>\d+) metrics?: (?P<list>.*?)\.?\s*$"
)
_LISTED_KERNEL = re.compile(r"^\s*\d+\.\s+(?P<name>.+?)\s*$")
_TAG = re.compile(r"^==(?P<tag>PROF|ERROR|WARNING|WARN|INFO)==\s?(?P<msg>.*)$")
_URL = re.compile(r"https?://\S+")

_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


def regex_escape(name: str) -> str:
    """Escape the regex metacharacters of a kernel name for ``-k regex:``.

    ncu's regexes are not Python's: only the classic metacharacters are escaped, since
    an escaped ordinary character (``\\~``, ``\\#``) is not portable between regex dialects.
    """
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in name)


def suggest_regex(kernels: list[str], requested: str | None = None) -> str | None:
    """A ``-k regex:`` body that matches the kernels most likely meant.

    Args:
        kernels: the names ncu listed under "Available Kernels".
        requested: the regex that matched nothing, if known; kernels sharing a word
            with it are preferred.

    Returns:
        An alternation of escaped names (unanchored: ncu matches regexes anywhere in the
        name, so a base name also matches its demangled form), or None without kernels.
    """
    names = [k for k in kernels if k]
    if not names:
        return None
    if requested:
        words = [w.lower() for w in re.findall(r"[A-Za-z0-9]{3,}", requested)]
        close = [k for k in names if any(w in k.lower() for w in words)]
        if close:
            names = close
    unique: list[str] = []
    for name in names:
        if name not in unique:
            unique.append(name)
    return "|".join(regex_escape(n) for n in unique)


def _percent(bar: str) -> int:
    """``0%....50%..`` → 70: the last printed percentage plus 10 for each dot after it."""
    last = 0
    dots = 0
    for m in re.finditer(r"(\d+)%|\.", bar):
        if m.group(1) is not None:
            last = int(m.group(1))
            dots = 0
        else:
            dots += 1
    return min(100, last + 10 * dots)


def progress_event(item: dict[str, Any]) -> dict[str, Any]:
    """The ``protocol.NcuProgress`` fields of a ``progress`` item (envelope not set)."""
    return {
        "type": "ncu_progress",
        "kernel": item["kernel"],
        "percent": int(item["percent"]),
        "passes": item["passes"],
        "done": bool(item["done"]),
    }


class NcuConsoleParser:
    """Incremental parser of ncu's stdout and stderr.

    Feed it chunks as they arrive with :meth:`feed` and call :meth:`close` at the end;
    both return the items recognised since the last call. The totals are kept on the
    parser (``reports``, ``errors``, ``warnings``, ``no_kernels``, ``perm_error``,
    ``driver_incompatible``, ``unavailable_metrics``, ``profiled``) for the summary.

    Args:
        requested_regex: the ``-k`` regex in use, to suggest a better one when nothing
            matched.
    """

    def __init__(self, requested_regex: str | None = None) -> None:
        self.requested_regex = requested_regex
        self._buf: dict[str, str] = {}
        self._partial: dict[str, tuple[str, int]] = {}  # stream -> (kernel, percent sent)
        # stream -> (kernel, launch, bar so far) of a progress line cut short by another
        self._interrupted: dict[str, tuple[str, int | None, str]] = {}
        self._listing: list[str] | None = None  # names under "Available Kernels:"
        self.reports: list[str] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.unavailable_metrics: list[str] = []
        self.no_kernels = False
        self.available_kernels: list[str] = []
        self.suggested_regex: str | None = None
        self.perm_error = False
        self.driver_incompatible = False
        #: ncu's "Failed to initialize the profiler: …" line (None: not seen).
        self.profiler_unavailable: str | None = None
        self.profiled: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ feeding
    def feed(self, chunk: str | bytes, stream: str = "stdout") -> list[dict[str, Any]]:
        """Take one raw chunk of a stream; return what it completed or advanced."""
        if isinstance(chunk, bytes):
            chunk = chunk.decode("utf-8", "replace")
        buf = self._buf.get(stream, "") + chunk
        items: list[dict[str, Any]] = []
        while True:
            nl = buf.find("\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1:]
            items.extend(self._line(line.rstrip("\r"), stream))
        self._buf[stream] = buf
        if buf:
            items.extend(self._partial_line(buf, stream))
        return items

    def close(self) -> list[dict[str, Any]]:
        """End of output: finish partial lines and a pending kernel listing."""
        items: list[dict[str, Any]] = []
        for stream in list(self._buf):
            rest = self._buf.pop(stream)
            if rest:
                items.extend(self._line(rest.rstrip("\r"), stream))
        items.extend(self._end_listing())
        return items

    def summary(self) -> dict[str, Any]:
        """Everything learned so far, as one dict."""
        return {
            "reports": list(self.reports),
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "perm_error": self.perm_error,
            "driver_incompatible": self.driver_incompatible,
            "no_kernels": self.no_kernels,
            "available_kernels": list(self.available_kernels),
            "suggested_regex": self.suggested_regex,
            "unavailable_metrics": list(self.unavailable_metrics),
            "profiled": [dict(p) for p in self.profiled],
        }

    # ------------------------------------------------------------------ lines
    def _partial_line(self, text: str, stream: str) -> list[dict[str, Any]]:
        """Progress on a line still being written (``==PROF== Profiling "k": 0%..``)."""
        text = _ANSI.sub("", text)
        cut = self._interrupted.get(stream)
        if cut is not None and re.match(r"^[0-9%.]+$", text):
            kernel, percent = cut[0], _percent(cut[2] + text)
            if self._partial.get(stream) == (kernel, percent):
                return []
            self._partial[stream] = (kernel, percent)
            return [{"kind": "progress", "kernel": kernel, "launch": cut[1],
                     "percent": percent, "passes": None, "done": False}]
        if not text.startswith("==PROF== Profiling "):
            return []
        m = re.match(r'^==PROF== Profiling "(?P<name>.*)"(?: - (?P<id>\d+))?: (?P<bar>[0-9%.]*)$',
                     text)
        if m is None:
            return []
        kernel = m.group("name")
        percent = _percent(m.group("bar"))
        sent = self._partial.get(stream)
        if sent is not None and sent == (kernel, percent):
            return []
        self._partial[stream] = (kernel, percent)
        return [{
            "kind": "progress",
            "kernel": kernel,
            "launch": int(m.group("id")) if m.group("id") else None,
            "percent": percent,
            "passes": None,
            "done": False,
        }]

    def _line(self, line: str, stream: str) -> list[dict[str, Any]]:
        line = _ANSI.sub("", line)
        items: list[dict[str, Any]] = []
        if self._listing is not None:
            m = _LISTED_KERNEL.match(line)
            if m is not None:
                self._listing.append(m.group("name"))
                return items
            if line.strip() == "Available Kernels:":
                return items
            items.extend(self._end_listing())

        m = _PROFILING.match(line)
        cut = self._interrupted.get(stream)
        c = _CONTINUED.match(line) if cut is not None and m is None else None
        if m is not None or c is not None:
            self._partial.pop(stream, None)
            self._interrupted.pop(stream, None)
            if m is not None:
                kernel = m.group("name")
                launch = int(m.group("id")) if m.group("id") else None
                bar, found = m.group("bar"), m.group("passes")
            else:
                assert c is not None and cut is not None
                kernel, launch = cut[0], cut[1]
                bar, found = cut[2] + c.group("bar"), c.group("passes")
            passes = int(found) if found else None
            if passes is None:
                self._interrupted[stream] = (kernel, launch, bar)
            item = {
                "kind": "progress",
                "kernel": kernel,
                "launch": launch,
                "percent": 100 if passes is not None else _percent(bar),
                "passes": passes,
                "done": passes is not None,
            }
            if passes is not None:
                self.profiled.append({"kernel": item["kernel"], "launch": item["launch"],
                                      "passes": passes})
            items.append(item)
            return items
        if line.startswith("==PROF== Profiling "):
            # A profiling line interrupted by something else (e.g. an error): close it.
            self._partial.pop(stream, None)
        m = _CONNECTED.match(line)
        if m is not None:
            items.append({"kind": "connected", "pid": int(m.group("pid")),
                          "process": m.group("proc")})
            return items
        m = _DISCONNECTED.match(line)
        if m is not None:
            self._interrupted.pop(stream, None)
            items.append({"kind": "disconnected", "pid": int(m.group("pid")), "process": None})
            return items
        m = _REPORT.match(line)
        if m is not None:
            self.reports.append(m.group("path"))
            items.append({"kind": "report", "path": m.group("path")})
            return items
        m = _TAG.match(line)
        if m is None:
            return items
        tag, msg = m.group("tag"), m.group("msg").strip()
        if "ERR_NVGPUCTRPERM" in msg:
            self.perm_error = True
            url = _URL.search(msg)
            items.append({"kind": "perm_error", "message": msg,
                          "url": url.group(0).rstrip(".") if url else None})
        elif "driver is not compatible" in msg.lower():
            self.driver_incompatible = True
            items.append({"kind": "driver_incompatible", "message": msg})
        elif "failed to initialize the profiler" in msg.lower():
            self.profiler_unavailable = msg
            items.append({"kind": "profiler_unavailable", "message": msg})
        elif "no kernels were profiled" in msg.lower():
            self.no_kernels = True
            self._listing = []
        elif _UNAVAILABLE.search(msg):
            u = _UNAVAILABLE.search(msg)
            assert u is not None
            names = [n.strip() for n in u.group("list").split(",") if n.strip()]
            self.unavailable_metrics.extend(names)
            items.append({"kind": "unavailable_metrics", "count": int(u.group("count")),
                          "metrics": names})
        elif tag == "ERROR":
            self.errors.append(msg)
            items.append({"kind": "error", "message": msg})
        elif tag in ("WARNING", "WARN"):
            self.warnings.append(msg)
            items.append({"kind": "warning", "message": msg})
        return items

    def _end_listing(self) -> list[dict[str, Any]]:
        if self._listing is None:
            return []
        kernels, self._listing = self._listing, None
        self.available_kernels = kernels
        self.suggested_regex = suggest_regex(kernels, self.requested_regex)
        return [{"kind": "no_kernels", "kernels": list(kernels),
                 "suggested_regex": self.suggested_regex}]
