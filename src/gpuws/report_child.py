"""The child process that parses a report file handed to ``gpuws report``.

A report is a file from somewhere else (pulled from a pod, mailed by a colleague), and
NVIDIA's ``ncu_report`` reads it natively: a 33 KB ``.ncu-repz`` (a zstd stream)
decompressed to 2.7 GB in-process, and mutated reports abort the interpreter with a C++
stack trace. So the parsing runs here, in a child of :mod:`gpuws.report` with its own
limits, set first thing, before any parser is imported:

* ``RLIMIT_AS``: its address space (the parent's ``--max-memory``);
* ``RLIMIT_CPU``: its CPU seconds (SIGXCPU past the soft limit, SIGKILL past the hard);
* ``RLIMIT_FSIZE``: the largest file it may write (the decompressed report, its answer);
* ``RLIMIT_CORE`` 0: a crash leaves no core file behind.

A ``.ncu-repz`` is decompressed here with ``zstandard`` (the ``report`` extra) into the
parent's private scratch directory, counting bytes as they come and stopping at the
decompressed cap, so a bomb is refused after reading at most the cap; without
``zstandard`` the module reads it itself, bounded only by the limits above.

The answer is one JSON object written to a file the parent names (ASCII: invalid text
from the report travels as ``\\udcXX`` escapes and the parent replaces it):
``{"ok": true, "kernels": [...]}`` or ``{"ok": false, "error": KIND, "detail": TEXT}``.
It imports only the standard library and the agent's reader (no Rich), so it starts fast
and small.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

#: First bytes of an uncompressed Nsight Compute report, and of a zstd frame.
REP_MAGIC = b"NVR\0"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: The suffixes ncu gives its reports.
REP_SUFFIXES = (".ncu-rep", ".ncu-repz")
#: A test may set this to ``segv`` to make the child kill itself with SIGSEGV just before
#: parsing: it stands in for the native aborts ``ncu_report`` has on mutated reports,
#: which a test cannot count on this machine's module version to reproduce.
FAULT_ENV = "GPUWS_REPORT_CHILD_FAULT"

#: The clocks ncu measured each launch at: report metric names, and the details page's
#: labels (the SpeedOfLight section collects them).
CLOCK_METRICS = {"sm_hz": ("gpc__cycles_elapsed.avg.per_second",
                           "sm__cycles_elapsed.avg.per_second"),
                 "dram_hz": ("dram__cycles_elapsed.avg.per_second",)}
CLOCK_LABELS = {"SM Frequency": "sm_hz", "DRAM Frequency": "dram_hz"}


class Refused(Exception):
    """A file the child will not (or cannot) read: its kind and a detail line."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def set_limits(memory: int, cpu_s: int, fsize: int) -> None:
    """Bound this process before it reads anything (Unix; elsewhere only the parent's
    wall timeout holds)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    limits = ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu_s),
              (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0))
    for which, soft in limits:
        _, hard = resource.getrlimit(which)
        # Past the soft CPU limit SIGXCPU; a hard limit a little later kills it for sure.
        want_hard = soft + 5 if which == resource.RLIMIT_CPU else soft
        if hard != resource.RLIM_INFINITY:
            soft, want_hard = min(soft, hard), min(want_hard, hard)
        try:
            resource.setrlimit(which, (soft, want_hard))
        except (ValueError, OSError):
            # macOS refuses RLIMIT_AS below what is mapped already; the others still hold.
            pass


def looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the end of the sample is still text.
        return exc.start >= len(head) - 3
    return True


def _is_ncu_text(text: str) -> bool:
    """ncu's own output: a CSV table (``"ID",…``) or its ``==PROF==`` style lines."""
    for line in text.splitlines():
        if line.startswith(('"ID",', "ID,", "==PROF==", "==ERROR==", "==WARNING==")):
            return True
    return False


def decompress(path: str, out_path: str, cap: int) -> None:
    """A zstd stream into ``out_path``, refused past ``cap`` decompressed bytes."""
    import zstandard  # type: ignore[import-not-found,unused-ignore]

    total = 0
    try:
        with open(path, "rb") as src, open(out_path, "wb") as dst:
            reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
            while True:
                chunk = reader.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
                if total > cap:
                    raise Refused("decompressed_too_large", str(cap))
                dst.write(chunk)
    except zstandard.ZstdError as exc:
        raise Refused("unreadable", f"its zstd stream is damaged ({exc})") from exc


def rep_clocks(module: Any, path: str) -> dict[int, dict[str, float]]:
    """The SM and DRAM clocks of each launch in a report, in ``read_ncu_rep``'s order."""
    out: dict[int, dict[str, float]] = {}
    ctx = module.load_report(path)
    launch = 0
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            names = set(action.metric_names())
            found: dict[str, float] = {}
            for key, candidates in CLOCK_METRICS.items():
                for name in candidates:
                    value = _metric_hz(action.metric_by_name(name)) if name in names else None
                    if value is not None:
                        found[key] = value
                        break
            if found:
                out[launch] = found
            launch += 1
    return out


def _metric_hz(metric: Any) -> float | None:
    import math

    from .remote_agent.profilers import ncu_reader

    try:
        value = float(metric.as_double())
        unit = metric.unit()
    except (AttributeError, TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    return ncu_reader.scale_value(value, unit if isinstance(unit, str) else None)[0]


def csv_clocks(text: str) -> dict[int, dict[str, float]]:
    """The SM and DRAM clocks of each launch (by ``ID``) in ncu's raw or details CSV."""
    import csv
    import io

    from .remote_agent.profilers import ncu_reader

    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(('"ID",', "ID,"))), None)
    if start is None:
        return {}
    # As ncu_reader: lines interleaved by the program or ncu never start with a quote.
    rows = list(csv.reader(io.StringIO("\n".join(
        [lines[start]] + [ln for ln in lines[start + 1:] if ln.startswith('"')]))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    out: dict[int, dict[str, float]] = {}
    if "Metric Name" in col and "Metric Value" in col:
        decimal = ncu_reader.detect_decimal(r[col["Metric Value"]] for r in body
                                            if len(r) > col["Metric Value"])
        for r in body:
            if len(r) <= col["Metric Value"] or not r[col["ID"]].strip().isdigit():
                continue
            key = CLOCK_LABELS.get(r[col["Metric Name"]])
            unit = r[col["Metric Unit"]] if "Metric Unit" in col else None
            value = ncu_reader.scale_value(
                ncu_reader.parse_number(r[col["Metric Value"]], decimal), unit)[0]
            if key is not None and value is not None:
                out.setdefault(int(r[col["ID"]]), {})[key] = value
        return out
    units = body[0] if body and body[0] and body[0][0] == "" else []
    data = [r for r in body if r and r[0].strip().isdigit()]
    wanted = {key: next((col[n] for n in names if n in col), None)
              for key, names in CLOCK_METRICS.items()}
    decimal = ncu_reader.detect_decimal(r[i] for r in data for i in wanted.values()
                                        if i is not None and i < len(r))
    for r in data:
        for key, i in wanted.items():
            if i is None or i >= len(r):
                continue
            unit = units[i] if i < len(units) else None
            value = ncu_reader.scale_value(ncu_reader.parse_number(r[i], decimal), unit)[0]
            if value is not None:
                out.setdefault(int(r[0]), {})[key] = value
    return out


def parse(path: str, scratch: str, decompressed_cap: int) -> list[dict[str, Any]]:
    """Every launch of the report at ``path``, with the clocks ncu measured it at."""
    from .remote_agent.profilers import ncu_reader

    with open(path, "rb") as f:
        head = f.read(4096)
    named_rep = path.endswith(REP_SUFFIXES)
    if not head:
        raise Refused("empty")
    if head.startswith((REP_MAGIC, ZSTD_MAGIC)) or (named_rep and not looks_like_text(head)):
        try:
            module = ncu_reader.load_ncu_report_module()
        except ImportError as exc:
            raise Refused("no_module", str(exc)) from exc
        target = path
        if head.startswith(ZSTD_MAGIC):
            try:
                import zstandard  # type: ignore[import-not-found,unused-ignore] # noqa: F401
            except ImportError:
                pass  # ncu_report decompresses it, bounded by this process's limits
            else:
                # The module tells reports by their suffix; ours is private to this run.
                target = os.path.join(scratch, "report.ncu-rep")
                decompress(path, target, decompressed_cap)
                with open(target, "rb") as f:
                    if not f.read(4).startswith(REP_MAGIC):
                        raise Refused("not_report")
        if os.environ.get(FAULT_ENV) == "segv":
            import signal
            os.kill(os.getpid(), signal.SIGSEGV)
        try:
            kernels = ncu_reader.read_ncu_rep(target, module=module)
            clocks = rep_clocks(module, target)
        except MemoryError:
            raise
        except Exception as exc:  # whatever the native module raises
            raise Refused("unreadable", f"{type(exc).__name__}: {exc}") from exc
        if not kernels and not head.startswith((REP_MAGIC, ZSTD_MAGIC)):
            raise Refused("not_report")
    elif looks_like_text(head):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if not text.strip():
            raise Refused("empty")
        if not _is_ncu_text(text):
            raise Refused("not_report")
        kernels = ncu_reader.read_csv(text)
        clocks = csv_clocks(text)
    else:
        raise Refused("not_report")
    for kernel in kernels:
        found = clocks.get(int(kernel.get("launch") or 0))
        if found:
            kernel["clocks"] = found
    return kernels


def main(argv: list[str]) -> int:
    """``python -m gpuws.report_child JOB``: JOB is the JSON the parent wrote (path,
    scratch directory, answer file, limits)."""
    job = json.loads(argv[0])
    set_limits(int(job["memory"]), int(job["cpu_s"]), int(job["fsize"]))
    try:
        answer: dict[str, Any] = {"ok": True, "kernels": parse(
            job["path"], job["scratch"], int(job["decompressed_cap"]))}
    except Refused as exc:
        answer = {"ok": False, "error": exc.kind, "detail": exc.detail}
    except MemoryError:
        answer = {"ok": False, "error": "memory", "detail": ""}
    except OSError as exc:
        answer = {"ok": False, "error": "os", "detail": str(exc)}
    # ASCII: a name the report holds as invalid text crosses as an escape, never as bytes.
    encoded = json.dumps(answer, ensure_ascii=True, allow_nan=True)
    with open(job["answer"], "w", encoding="ascii") as f:
        f.write(encoded)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
