"""Read a handed Nsight Compute report in a child process with bounds.

A ``.ncu-rep`` handed to ``gpuws report`` is the pod's word (or anybody's): NVIDIA's
``ncu_report`` parses it in native code that was never meant for hostile input. Tried as an
adversary would, a 33 KB ``.ncu-repz`` (a zstd stream) took 2.7 GB and 84 s in-process, a
39 KB one passed 9.2 GB, and 9 of 254 mutated reports killed the process with a native
abort. So the parse runs in a child of the same interpreter (``python -m
gpuws.report_child FILE``) under ``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` and no core
file, with a wall-clock timeout, and a ``.ncu-repz`` whose zstd frames could expand past a
cap is refused before anything decompresses it (:func:`zstd_bound` reads only the frames'
headers). Whatever the child does, the parent gets plain JSON it validates, or one line.
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChildFailure", "Limits", "kind_of", "read_in_child", "zstd_bound"]

#: The first bytes of an uncompressed ``.ncu-rep`` ("NVR\0") and of a zstd frame.
REP_MAGIC = b"NVR\x00"
ZSTD_MAGIC = 0xFD2FB528
#: Skippable zstd frames: magic 0x184D2A50–0x184D2A5F, then a 4-byte length.
_SKIPPABLE = 0x184D2A50
#: A compressed block never yields more than this (the format's Block_Maximum_Size).
_BLOCK_MAX = 128 << 10


@dataclass(frozen=True)
class Limits:
    """What one report read may take.

    The defaults hold an honest report with room: the recorded H200 saxpy report loads at a
    144 MiB peak; reports of many kernels with the full set are tens of MiB on disk.
    """

    #: Address space of the child (the parse, ncu_report's native code, Python).
    memory_mib: int = 1024
    #: CPU seconds of the child, and the wall-clock seconds the parent waits.
    seconds: float = 60.0
    #: Largest report file accepted at all.
    file_mib: int = 512
    #: Most a ``.ncu-repz`` may decompress to, from its frames' headers.
    decompressed_mib: int = 1024
    #: Most JSON the child may hand back: the laptop's own process holds it decoded (at
    #: this cap about 10x in memory) and prints it; ``--max-memory`` raises it with the
    #: child's memory (:func:`output_mib_for`).
    output_mib: int = 16


def output_mib_for(memory_mib: int) -> int:
    """The answer cap that goes with a child of ``memory_mib``: 16 MiB at the default."""
    return max(16, memory_mib // 64)


class ChildFailure(Exception):
    """The child did not hand back a result: why, in words for the person."""

    def __init__(self, cause: str, remedy: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


def kind_of(path: Path) -> str:
    """``rep``, ``repz``, ``text`` or ``other``, from the file's first bytes."""
    with path.open("rb") as f:
        head = f.read(4096)
    if head.startswith(REP_MAGIC):
        return "rep"
    if len(head) >= 4 and struct.unpack("<I", head[:4])[0] == ZSTD_MAGIC:
        return "repz"
    if b"\0" in head:
        return "other"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut in the middle of a character at the 4,096th byte is still text.
        if exc.start < len(head) - 3:
            return "other"
    return "text"


def zstd_bound(path: Path, cap: int) -> int:
    """An upper bound of what the zstd stream in ``path`` decompresses to.

    Walks the frames' and blocks' headers only (RFC 8878 §3.1): a raw or RLE block yields
    its Block_Size, a compressed one at most 128 KiB, a frame at most its declared content
    size when it has one. Stops as soon as the bound passes ``cap``.

    Raises:
        ValueError: the stream is not well-formed zstd (what a decoder would refuse too).
    """
    total = 0
    with path.open("rb") as f:
        while True:
            magic_b = f.read(4)
            if not magic_b:
                return total
            if len(magic_b) < 4:
                raise ValueError("a zstd frame cut short")
            magic = struct.unpack("<I", magic_b)[0]
            if magic & 0xFFFFFFF0 == _SKIPPABLE:
                size_b = f.read(4)
                if len(size_b) < 4:
                    raise ValueError("a skippable frame cut short")
                f.seek(struct.unpack("<I", size_b)[0], os.SEEK_CUR)
                continue
            if magic != ZSTD_MAGIC:
                raise ValueError(f"not a zstd frame (magic {magic:08x})")
            fhd_b = f.read(1)
            if not fhd_b:
                raise ValueError("a zstd frame header cut short")
            fhd = fhd_b[0]
            fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, \
                fhd & 3
            if fhd & 0x08:
                raise ValueError("a zstd frame header with its reserved bit set")
            skip = (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
            f.seek(skip, os.SEEK_CUR)
            fcs_size = (1 if single else 0, 2, 4, 8)[fcs_flag]
            declared = None
            if fcs_size:
                raw = f.read(fcs_size)
                if len(raw) < fcs_size:
                    raise ValueError("a zstd frame header cut short")
                declared = int.from_bytes(raw, "little") + (256 if fcs_size == 2 else 0)
                if declared > cap:
                    return declared  # a decoder may allocate what the frame declares
            frame = 0
            while True:
                bh = f.read(3)
                if len(bh) < 3:
                    raise ValueError("a zstd block header cut short")
                header = int.from_bytes(bh, "little")
                last, btype, bsize = header & 1, (header >> 1) & 3, header >> 3
                if btype == 3:
                    raise ValueError("a reserved zstd block type")
                frame += _BLOCK_MAX if btype == 2 else bsize
                f.seek(1 if btype == 1 else bsize, os.SEEK_CUR)
                if total + frame > cap:
                    return total + frame
                if last:
                    break
            if checksum:
                f.seek(4, os.SEEK_CUR)
            total += frame if declared is None else min(frame, declared)


def _limit_child(limits: Limits) -> None:
    """In the child before exec: its bounds, its own session, no core file."""
    import resource

    mem = limits.memory_mib << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = max(1, math.ceil(limits.seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    out = max(limits.output_mib, limits.decompressed_mib) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()  # a timeout kills its whole group, whatever the module started


def read_in_child(path: Path, limits: Limits, kind: str) -> dict[str, Any]:
    """``{"kernels": [...], "clocks": {launch: {...}}}`` read from ``path`` by a bounded child.

    Raises:
        ChildFailure: the file is over a bound, or the child crashed, ran out of memory or
            time, or handed back something that is not the expected JSON.
    """
    size = path.stat().st_size
    if size > limits.file_mib << 20:
        raise ChildFailure(f"the file is {size / 2**20:,.0f} MiB, over the {limits.file_mib} MiB "
                           "a report may be", "check that this is the report you meant")
    if kind == "repz":
        cap = limits.decompressed_mib << 20
        try:
            bound = zstd_bound(path, cap)
        except ValueError as exc:
            raise ChildFailure(f"its zstd stream is damaged ({exc})",
                               "pull the report again (`gpuws pull`)") from exc
        if bound > cap:
            raise ChildFailure(
                f"it could decompress to more than {limits.decompressed_mib:,} MiB (its "
                f"{size:,} bytes of zstd frames allow that much; nothing was decompressed)",
                "a real report of that size is unlikely: check where it came from")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuws.report_child", str(path), kind],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                preexec_fn=lambda: _limit_child(limits))
        except OSError as exc:
            raise ChildFailure(f"the reader could not start ({exc})",
                               "check the Python that runs gpuws") from exc
        try:
            rc = proc.wait(timeout=limits.seconds + 5.0)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise ChildFailure(f"reading it took more than {limits.seconds:g} s",
                               _raise_or_pull("--timeout")) from None
        except BaseException:
            _kill_group(proc)  # Ctrl+C: the child goes too
            raise
        err.seek(0)
        tail = err.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
        last = tail[-1] if tail else ""
        if rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            if -rc == signal.SIGXCPU:
                raise ChildFailure(f"reading it used more than {limits.seconds:g} s of CPU",
                                   _raise_or_pull("--timeout"))
            if -rc == signal.SIGABRT and any("bad_alloc" in line for line in tail):
                # ncu_report's C++ out of memory under RLIMIT_AS: an abort, but not a crash.
                raise ChildFailure(f"it needs more than {limits.memory_mib:,} MiB to read",
                                   _raise_or_pull("--max-memory"))
            raise ChildFailure(f"the report reader crashed ({sig}) on it",
                               "the file is damaged or not a report: pull it again "
                               "(`gpuws pull`), or read it with ncu on the pod")
        if rc == 3 or any(_OUT_OF_MEMORY in line or "MemoryError" in line for line in tail):
            raise ChildFailure(f"it needs more than {limits.memory_mib:,} MiB to read",
                               _raise_or_pull("--max-memory"))
        if rc == 4:
            raise ChildFailure(last or "ncu_report is not installed", _INSTALL_HINT)
        if rc != 0:
            raise ChildFailure(f"ncu_report could not read it ({last or f'exit {rc}'})",
                               "check that the file was copied whole")
        if out.tell() > limits.output_mib << 20:
            raise ChildFailure(f"what it holds takes more than {limits.output_mib} MiB as JSON",
                               _raise_or_pull("--max-memory"))
        out.seek(0)
        try:
            # Checked as it is decoded, one object at a time: parsed whole and then cleaned
            # into a copy, a 16 MiB answer had the laptop's process at 306 MiB.
            data = json.loads(out.read(), object_hook=_sane, parse_float=_finite,
                              parse_constant=lambda _: None)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ChildFailure(f"the reader handed back no valid JSON ({exc})",
                               "a damaged or hostile report") from exc
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), list) \
            or not all(isinstance(k, dict) for k in data["kernels"]) \
            or not isinstance(data.get("clocks"), dict):
        raise ChildFailure("the reader handed back an unexpected shape",
                           "a damaged or hostile report")
    return data


def _text(value: str) -> str:
    """A string from the child as valid UTF-8 (a lone surrogate from a mangled name
    becomes ``?``)."""
    return value.encode("utf-8", "replace").decode("utf-8") if not value.isascii() else value


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999 reads as inf


def _sane(obj: dict[str, Any]) -> dict[str, Any]:
    """One decoded JSON object with its keys and string values (and those of its lists)
    made valid UTF-8; nested objects were already seen by this hook."""
    return {_text(k): _text(v) if isinstance(v, str) else
            [_text(x) if isinstance(x, str) else x for x in v] if isinstance(v, list) else v
            for k, v in obj.items()}


#: How the child says, on its last line, that it ran out of its address space whatever
#: form the failure took (the parent turns it into the ``--max-memory`` line).
_OUT_OF_MEMORY = "gpuws-report-child: out of memory"

#: What an exception says where a library could not get memory (a shared object that
#: cannot be mapped reads as an ImportError; ENOMEM as an OSError).
_NO_MEMORY_WORDS = ("failed to map segment", "Cannot allocate memory", "bad_alloc",
                    "out of memory")


def _near_limit() -> bool:
    """Whether this process came close to its ``RLIMIT_AS``: its peak address space
    (``VmPeak``) within an eighth of the limit (at least 16 MiB). Under the limit, what
    fails to get memory does not always say so: ``ncu_report`` answered an empty report
    ("holds no profiled kernel"), a ``SystemError``, or an ``ImportError`` (issue 31)."""
    import errno
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return False
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            peak_kib = next((int(line.split()[1]) for line in f
                             if line.startswith("VmPeak:")), None)
    except MemoryError:
        return True  # too close to the limit to read a small file: that is the answer
    except OSError as exc:
        return exc.errno == errno.ENOMEM
    except ValueError:
        return False
    return peak_kib is not None and peak_kib * 1024 >= soft - max(soft // 8, 16 << 20)


def _out_of_memory(why: str = "") -> bool:
    """Whether a failure (or an empty answer) was the address-space limit: said by the
    exception's words, or shown by the peak."""
    return any(w in why for w in _NO_MEMORY_WORDS) or _near_limit()


def _raise_or_pull(flag: str) -> str:
    """The remedy where a bound was reached: the person knows whether the file is honest."""
    return (f"if the file is honest (a long profile), give `gpuws report` a larger {flag}; "
            "else it is damaged or hostile: pull it again")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


#: How to get ``ncu_report`` for each way of installing gpuws (the ``report`` extra).
_INSTALL_HINT = ("install the report extra: `pip install 'gpuws[report]'` (pip), "
                 "`pipx inject gpuws ncu-report` (pipx), `uv tool install --with ncu-report "
                 "gpuws` (uv), or export a CSV on the pod: ncu --import FILE --csv --page raw "
                 "> FILE.csv")


def _child(path: str, kind: str) -> int:
    """The child: read the report (or ncu's CSV, ``kind`` ``text``), print JSON on stdout.
    Exit 3: out of memory; 4: no ncu_report; 1: the module refused the file (its message
    last on stderr)."""
    try:
        from .report import read_csv_here, read_rep_here

        answer: dict[str, Any]
        if kind == "text":
            kernels, clocks, blank_or_ncu = read_csv_here(path)
            answer = {"kernels": kernels, "clocks": clocks, "blank_or_ncu": blank_or_ncu}
        else:
            kernels, clocks = read_rep_here(path)
            answer = {"kernels": kernels, "clocks": clocks}
        if not kernels and _out_of_memory():
            return _say_out_of_memory()
        sys.stdout.write(json.dumps(answer, ensure_ascii=True, allow_nan=True))
        sys.stdout.flush()
    except MemoryError:
        os._exit(3)
    except ImportError as exc:
        if _out_of_memory(str(exc)):
            return _say_out_of_memory()
        sys.stderr.write(f"ncu_report is not installed ({exc})\n")
        return 4
    except Exception as exc:  # the module's own refusal, said in one line to the parent
        if _out_of_memory(str(exc)):
            return _say_out_of_memory()
        sys.stderr.write(f"{type(exc).__name__}: {str(exc)[:500]}\n")
        return 1
    return 0


def _say_out_of_memory() -> int:
    sys.stderr.write(_OUT_OF_MEMORY + "\n")
    return 3


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "rep"))
