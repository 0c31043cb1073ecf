"""Hostile files handed to ``gpuws report`` (issue 26, point 4): refused cleanly, bounded.

Through the real CLI (``python -m gpuws report``) and the real ``ncu_report`` module where
the report extra is installed: a zstd bomb, reports mutated from the recorded H200 one, a
folder, a FIFO, a text file. Where a failure cannot be made on cue with the real module (a
native abort, memory exhaustion, a hang, a name that is not UTF-8), a stand-in
``ncu_report`` first on the child's path plays it, and the test says so. Figures go
through ``record`` (docs/reliability.md, "Hostile report files").
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.errors import GpuwsError
from gpuws.report import read_report
from gpuws.report_child import Limits, zstd_bound

REP = Path(__file__).parents[1] / "fixtures" / "recorded" / "saxpy_h200.ncu-rep"


def gpuws_report(*args: str, env: dict[str, str] | None = None,
                 timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "gpuws", "report", *args],
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


def one_clean_line(res: subprocess.CompletedProcess[bytes]) -> str:
    err = res.stderr.decode("utf-8")
    assert res.returncode == 2, (res.returncode, err)
    assert err.startswith("gpuws: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not res.stdout
    return err


# The command run in a Python that reports its own peak RSS in KiB (the laptop's process,
# not the child's) on a last stderr line: VmHWM, its own address space's high-water mark
# (Linux carries the forking process's peak into ru_maxrss across exec, here pytest's).
_PEAK = ("import sys\nfrom gpuws.cli import main\nrc = main(sys.argv[1:])\n"
         "hwm = [ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
         "sys.stderr.write('PEAK %s\\n' % hwm[0])\nsys.exit(rc)\n")


def gpuws_report_peak(*args: str, env: dict[str, str] | None = None
                      ) -> tuple[subprocess.CompletedProcess[bytes], str, float]:
    """``gpuws report ARGS``, its stderr without the PEAK line, and its own peak in MiB."""
    res = subprocess.run([sys.executable, "-c", _PEAK, "report", *args], capture_output=True,
                         timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    err, peak = res.stderr.decode("utf-8").rsplit("PEAK ", 1)
    return res, err, int(peak) / 1024


def rle_bomb(path: Path, gib: int) -> None:
    """A zstd frame of RLE blocks: 4 bytes each that expand to 128 KiB (RFC 8878 §3.1.1.2)."""
    out = bytearray(struct.pack("<I", 0xFD2FB528)) + bytes([0x00, 0x38])  # 128 KiB window
    blocks = gib * 8192
    for i in range(blocks):
        out += ((131072 << 3) | (1 << 1) | (i == blocks - 1)).to_bytes(3, "little") + b"\x00"
    path.write_bytes(bytes(out))


def test_a_zstd_bomb_is_refused_before_anything_decompresses(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.ncu-repz"
    rle_bomb(bomb, 4)  # 131 KB on disk, 4 GiB decompressed
    t0 = time.monotonic()
    # The process's own peak: RUSAGE_CHILDREN would report the largest child pytest ever
    # waited for (another test's), and ru_maxrss starts at pytest's size.
    res, err, peak_mib = gpuws_report_peak(str(bomb))
    took = time.monotonic() - t0
    assert res.returncode == 2 and not res.stdout and "Traceback" not in err, err
    assert err.startswith("gpuws: ") and err.count("\n") == 1, err
    assert "could decompress to more than 1,024 MiB" in err and "nothing was decompressed" in err
    record("test_a_zstd_bomb_is_refused_before_anything_decompresses",
           bomb_bytes=bomb.stat().st_size, decompressed_gib=4, refused=1,
           seconds_to_refusal=round(took, 2), peak_rss_mib=round(peak_mib, 1))


def test_the_bound_of_an_honest_zstd_report_holds_what_it_decompresses_to(
        tmp_path: Path) -> None:
    # zstd's own encoder where installed; the bound must be no less than the real size
    # and within a block per frame of it.
    zstd = pytest.importorskip("shutil").which("zstd")
    if zstd is None:
        pytest.skip("no zstd CLI to compress with")
    repz = tmp_path / "saxpy.ncu-repz"
    repz.write_bytes(subprocess.run([zstd, "-q", "-c", str(REP)], capture_output=True,
                                    check=True).stdout)
    size = REP.stat().st_size
    bound = zstd_bound(repz, 1 << 40)
    assert size <= bound <= size + (128 << 10) * 4, (size, bound)
    with pytest.raises(ValueError):
        zstd_bound(_cut(repz, tmp_path), 1 << 40)


def _cut(path: Path, tmp_path: Path) -> Path:
    cut = tmp_path / "cut.ncu-repz"
    cut.write_bytes(path.read_bytes()[:9])
    return cut


def test_mutated_real_reports_never_crash_the_command(tmp_path: Path) -> None:
    """The recorded H200 report truncated and flipped, through the real module."""
    pytest.importorskip("ncu_report")
    rng = random.Random(2026)
    data = REP.read_bytes()
    outcomes = {"read": 0, "refused": 0}
    crashes = invalid_json = 0
    for i in range(24):
        mutated = bytearray(data)
        if i % 3 == 0:
            mutated = mutated[:rng.randrange(4, len(data))]
        else:
            for _ in range(rng.choice((1, 8, 64))):
                mutated[rng.randrange(4, len(mutated))] = rng.randrange(256)
        path = tmp_path / f"m{i}.ncu-rep"
        path.write_bytes(bytes(mutated))
        res = gpuws_report("--json", str(path))
        err = res.stderr.decode("utf-8", "replace")
        if res.returncode == 0:
            try:
                json.loads(res.stdout.decode("utf-8"))
                outcomes["read"] += 1
            except (UnicodeDecodeError, ValueError):
                invalid_json += 1
        elif res.returncode == 2 and err.startswith("gpuws: ") and err.count("\n") == 1:
            outcomes["refused"] += 1
        else:
            crashes += 1
    record("test_mutated_real_reports_never_crash_the_command", mutated=24,
           read=outcomes["read"], refused_in_one_line=outcomes["refused"], crashes=crashes,
           invalid_json=invalid_json)
    assert crashes == 0 and invalid_json == 0, outcomes


def fake_module(tmp_path: Path, body: str) -> dict[str, str]:
    site = tmp_path / "fake_site"
    site.mkdir(exist_ok=True)
    (site / "ncu_report.py").write_text(textwrap.dedent(body))
    # The stand-in first, then the path the tests run with: the gpuws under test (a
    # worktree's src), not whichever one the interpreter has installed.
    return {"PYTHONPATH": os.pathsep.join(
        x for x in (str(site), os.environ.get("PYTHONPATH")) if x)}


@pytest.mark.parametrize(("body", "words"), [
    # A stand-in for the native aborts 9 of 254 mutated reports caused (exit 134).
    ("import os\ndef load_report(path):\n    os.abort()\n", "crashed (SIGABRT)"),
    ("import ctypes\ndef load_report(path):\n    ctypes.string_at(0)\n", "crashed (SIGSEGV)"),
    # A stand-in for a parse that wants the machine's memory.
    ("def load_report(path):\n    return bytearray(8 << 30)\n", "needs more than 1,024 MiB"),
])
def test_a_reader_that_dies_becomes_one_line(tmp_path: Path, body: str, words: str) -> None:
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    err = one_clean_line(gpuws_report(str(rep), env=fake_module(tmp_path, body)))
    assert words in err, err


def test_a_reader_that_hangs_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for a parse that never ends (the 96 KB bomb ran for over 200 s), at a 1 s
    # bound; the child's own group is killed with it.
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    for key, value in fake_module(tmp_path, "import time\ndef load_report(path):\n"
                                            "    time.sleep(3600)\n").items():
        monkeypatch.setenv(key, value)
    t0 = time.monotonic()
    with pytest.raises(GpuwsError, match="took more than 1 s"):
        read_report(rep, Limits(seconds=1.0))
    spin = "def load_report(path):\n    while True:\n        pass\n"
    for key, value in fake_module(tmp_path, spin).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(GpuwsError, match="more than 1 s of CPU"):
        read_report(rep, Limits(seconds=1.0))
    record("test_a_reader_that_hangs_is_stopped", hangs=2, stopped=2,
           seconds_for_both=round(time.monotonic() - t0, 1))


def test_names_that_are_not_utf8_still_give_valid_json(tmp_path: Path) -> None:
    # A stand-in module handing back a name with a lone surrogate (how undecodable bytes
    # arrive in Python) and a NaN metric.
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    env = fake_module(tmp_path, """
        from types import SimpleNamespace as NS
        metric = NS(has_value=lambda: True, kind=lambda: 4, as_double=lambda: float("nan"),
                    unit=lambda: "ns")
        action = NS(name=lambda *base: "k\\udcff\\x1b]52;c;QUJD\\x07",
                    rule_results_as_dicts=lambda: [],
                    metric_names=lambda: ("gpu__time_duration.sum",),
                    metric_by_name=lambda name: metric)
        rng = NS(num_actions=lambda: 1, action_by_idx=lambda i: action)
        def load_report(path):
            return NS(num_ranges=lambda: 1, range_by_idx=lambda i: rng)
        """)
    res = gpuws_report("--json", str(rep), env=env)
    assert res.returncode == 0, res.stderr
    (kernel,) = json.loads(res.stdout.decode("utf-8"))  # strict UTF-8, valid JSON
    assert kernel["kernel"].startswith("k?") and kernel["metrics"]["duration_ns"] is None
    shown = gpuws_report(str(rep), env=env)
    assert shown.returncode == 0 and b"\x1b" not in shown.stdout


def test_what_is_not_a_report_says_what_it_is(tmp_path: Path) -> None:
    readme = Path(__file__).parents[2] / "README.md"
    assert "is not an Nsight Compute report" in one_clean_line(gpuws_report(str(readme)))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(4096))
    assert "is not an Nsight Compute report" in one_clean_line(gpuws_report(str(blob)))
    assert "is a folder, not a report" in one_clean_line(gpuws_report(str(tmp_path)))
    assert "no such file" in one_clean_line(gpuws_report(str(tmp_path / "nope.ncu-rep")))
    fifo = tmp_path / "fifo.ncu-rep"
    os.mkfifo(fifo)
    assert "not a regular file" in one_clean_line(gpuws_report(str(fifo), timeout=60))
    big = tmp_path / "big.ncu-rep"
    with big.open("wb") as f:  # sparse: 600 MiB that take no disk
        f.write(b"NVR\x00")
        f.truncate(600 << 20)
    assert "over the 512 MiB" in one_clean_line(gpuws_report(str(big)))


def long_csv(path: Path, mib: int) -> int:
    """ncu's details CSV of the recorded H200 saxpy, its launch repeated under new IDs
    until the file is ``mib`` MiB: what a long (or hostile) profile's CSV looks like."""
    lines = (Path(__file__).parents[1] / "fixtures" / "ncu-2025.3.1-h200"
             / "saxpy_details.csv").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    header, rows = lines[start], [ln.split('","', 1)[1] for ln in lines[start + 1:]
                                  if ln.startswith('"0"')]
    launches = 0
    with path.open("w", encoding="utf-8") as f:
        f.write(header + "\n")
        while f.tell() < mib << 20:
            f.write("".join(f'"{launches}","{row}\n' for row in rows))
            launches += 1
    return launches


def test_a_long_csv_is_parsed_in_the_bounded_child_too(tmp_path: Path) -> None:
    """A CSV was read whole and parsed in the laptop's own process: a 200 MiB one took
    3.5 GB and 63 s there. Now it meets the child's bounds, which a person with an honest
    long profile can raise (``--max-memory``), and the laptop's process stays small."""
    big = tmp_path / "long.csv"
    launches = long_csv(big, 48)
    t0 = time.monotonic()
    res, err, peak_mib = gpuws_report_peak(str(big), "--json", "--max-memory", "256")
    took = time.monotonic() - t0
    assert res.returncode == 2 and not res.stdout, (res.returncode, err)
    assert err.startswith("gpuws: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "needs more than 256 MiB to read" in err and "--max-memory" in err, err
    assert peak_mib < 128, peak_mib  # the file is 48 MiB; parsed here it took ~16x that
    # Within the bounds, the same kind of file reads as before, every launch and its clocks.
    small = tmp_path / "short.csv"
    n = long_csv(small, 1)
    ok = gpuws_report(str(small), "--json")
    assert ok.returncode == 0, ok.stderr
    kernels = json.loads(ok.stdout.decode("utf-8"))
    assert len(kernels) == n and all(k["clocks"]["sm_hz"] > 1e9 for k in kernels)
    record("test_a_long_csv_is_parsed_in_the_bounded_child_too",
           csv_mib=round(big.stat().st_size / 2**20, 1), launches=launches,
           max_memory_mib=256, refused=1, seconds_to_refusal=round(took, 2),
           laptop_process_peak_rss_mib=round(peak_mib, 1))


@pytest.mark.parametrize("args", [("--max-memory", "0"), ("--max-memory", "lots"),
                                  ("--timeout", "nan"), ("--timeout", "-1")])
def test_the_bounds_a_person_gives_are_checked(args: tuple[str, str]) -> None:
    res = gpuws_report(str(REP), *args)
    assert res.returncode == 2 and not res.stdout
    assert "Traceback" not in res.stderr.decode("utf-8")


def test_a_report_of_many_launches_keeps_the_laptop_process_small(tmp_path: Path) -> None:
    """The child's answer is decoded and printed by the laptop's own process. A stand-in
    ``ncu_report`` hands back N launches (the real module cannot be made to on cue; an
    object-heavy answer is the worst case for memory per byte): just under the 16 MiB
    answer cap the process must stay small; past it, one line names ``--max-memory``,
    which raises the cap with the child's memory."""
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    env = fake_module(tmp_path, """
        import os
        from types import SimpleNamespace as NS
        metric = NS(has_value=lambda: True, kind=lambda: 4, as_double=lambda: 1234.0,
                    unit=lambda: "ns")
        action = NS(name=lambda *base: "k", rule_results_as_dicts=lambda: [],
                    metric_names=lambda: ("gpu__time_duration.sum",),
                    metric_by_name=lambda name: metric)
        def load_report(path):
            n = int(os.environ["FAKE_LAUNCHES"])
            rng = NS(num_actions=lambda: n, action_by_idx=lambda i: action)
            return NS(num_ranges=lambda: 1, range_by_idx=lambda i: rng)
        """)

    def run(launches: int, *args: str) -> tuple[subprocess.CompletedProcess[bytes], str, float]:
        return gpuws_report_peak("--json", str(rep), *args,
                                 env={**env, "FAKE_LAUNCHES": str(launches)})

    res, err, peak_mib = run(30_000)  # its answer: about 15.5 MiB of JSON
    assert res.returncode == 0, err
    kernels = json.loads(res.stdout.decode("utf-8"))
    assert len(kernels) == 30_000 and kernels[-1]["metrics"]["duration_ns"] == 1234.0
    # Decoded whole, cleaned into a copy and printed as one string, this took 306 MiB.
    assert peak_mib < 128, peak_mib
    res, err, refused_peak = run(34_000)
    assert res.returncode == 2 and not res.stdout and "Traceback" not in err, err
    assert err.startswith("gpuws: ") and err.count("\n") == 1, err
    assert "more than 16 MiB as JSON" in err and "--max-memory" in err, err
    raised, err, _ = run(34_000, "--max-memory", "2048")
    assert raised.returncode == 0 and len(json.loads(raised.stdout)) == 34_000, err
    record("test_a_report_of_many_launches_keeps_the_laptop_process_small",
           launches_read=30_000, answer_cap_mib=16,
           laptop_process_peak_rss_mib=round(peak_mib, 1), launches_refused=34_000,
           refused_peak_rss_mib=round(refused_peak, 1), read_with_max_memory_2048=1)


def test_a_cpp_out_of_memory_abort_is_called_out_of_memory(tmp_path: Path) -> None:
    """``ncu_report`` runs out of memory in C++: under the child's RLIMIT_AS it throws
    ``std::bad_alloc``, which ends in ``terminate`` and SIGABRT (seen with the real module
    and the recorded H200 report under a 200 MiB address space). That is the bound doing
    its work, not a crash, and the remedy is the bound's option. A stand-in module writes
    what libstdc++ writes and aborts, since the real one's allocation pattern (which
    limits it fails under) is no contract."""
    rep = tmp_path / "x.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    env = fake_module(tmp_path, """
        import os, sys
        def load_report(path):
            sys.stderr.write("terminate called after throwing an instance of "
                             "'std::bad_alloc'\\n  what():  std::bad_alloc\\n")
            sys.stderr.flush()
            os.abort()
        """)
    err = one_clean_line(gpuws_report(str(rep), "--max-memory", "300", env=env))
    assert "needs more than 300 MiB to read" in err and "--max-memory" in err, err
    assert "crashed" not in err
