"""ncu (and nsys) output the readers have never seen: truncated, other units, another
locale's separators, ``n/a`` cells, empty reports, garbage.

Built from the real H200 fixtures by rewriting them: the readers must never raise, must
give the same canonical metrics whatever unit or separators ncu printed them in, must
say "not measured" (``None``) rather than invent a number, and must give nothing (not
an error) for a report with no kernel in it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.remote_agent.measure.tier2_parse import Tier2ParseError, parse_nsys_kern_sum_csv
from gpuws.remote_agent.profilers import ncu_reader
from gpuws.remote_agent.profilers.ncu_output import NcuConsoleParser
from gpuws.report import ReportError, read_report

FIX = Path(__file__).parent.parent / "fixtures" / "ncu-2025.3.1-h200"
RAW = {n: (FIX / n).read_text() for n in ("saxpy_raw.csv", "gemm_raw.csv")}
DETAILS = {n: (FIX / n).read_text() for n in ("saxpy_details.csv", "gemm_details.csv")}
LOGS = {n: (FIX / n).read_text() for n in ("gemm_full.log", "saxpy_human.txt",
                                           "no_kernels.txt", "saxpy_raw.stderr")}
FIGURES: dict[str, int] = {}
#: Units ncu may print instead of the base ones (--print-units auto), with their factor.
RESCALE = {"ns": ("usecond", 1e3), "byte": ("Kbyte", 1e3), "hz": ("Mhz", 1e6),
           "byte/s": ("Gbyte/s", 1e9), "cycle": ("Kcycle", 1e3), "inst": ("Minst", 1e6)}


def bump(key: str, n: int = 1) -> None:
    FIGURES[key] = FIGURES.get(key, 0) + n


#: A crash: a reader raising anything but the one clear error it documents for input it
#: cannot read (``ReportError``, ``Tier2ParseError``). Counted as it happens, then raised.
CRASHES: list[str] = []
T = TypeVar("T")


@contextlib.contextmanager
def crash_counted() -> Iterator[None]:
    try:
        yield
    except (ReportError, Tier2ParseError):
        raise
    except Exception as exc:
        CRASHES.append(f"{type(exc).__name__}: {exc}")
        raise


def counted(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with :func:`crash_counted` around every call."""
    def call(*args: Any, **kwargs: Any) -> T:
        with crash_counted():
            return fn(*args, **kwargs)
    return call


read_csv = counted(ncu_reader.read_csv)
read_raw_csv = counted(ncu_reader.read_raw_csv)
read_report_counted = counted(read_report)
parse_kern_sum = counted(parse_nsys_kern_sum_csv)


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """Lines before the CSV header, and the CSV rows."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
    return lines[:start], list(csv.reader(io.StringIO("\n".join(lines[start:]))))


def render(pre: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "\n".join(pre) + "\n" + out.getvalue()


def num(cell: str) -> float | None:
    return ncu_reader.parse_number(cell, ".")


def fmt(value: float) -> str:
    return repr(value)


def same(a: list[dict[str, Any]], b: list[dict[str, Any]], rel: float = 1e-9) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x["kernel"] == y["kernel"] and x["launch"] == y["launch"]
        for key, v in x["metrics"].items():
            w = y["metrics"][key]
            assert (v is None) == (w is None), key
            if v is not None:
                assert math.isclose(v, w, rel_tol=rel, abs_tol=1e-9), (key, v, w)


def sane(launches: list[dict[str, Any]]) -> None:
    for launch in launches:
        for key, v in launch["metrics"].items():
            assert v is None or (isinstance(v, float) and math.isfinite(v)), (key, v)
        for s in launch["stalls"]:
            assert math.isfinite(s["pct"])


@pytest.mark.parametrize("name", sorted(RAW))
def test_other_units_give_the_same_metrics(name: str) -> None:
    pre, rows = table(RAW[name])
    header, units, data = rows[0], rows[1], rows[2:]
    changed = 0
    for col, unit in enumerate(units):
        if unit not in RESCALE:
            continue
        new_unit, factor = RESCALE[unit]
        units[col] = new_unit
        for row in data:
            v = num(row[col])
            if v is not None:
                row[col] = fmt(v / factor)
                changed += 1
    assert changed > 10
    base = read_raw_csv(RAW[name])
    rescaled = read_raw_csv(render(pre, [header, units, *data]))
    same(base, rescaled)
    assert any(v is not None for v in rescaled[0]["metrics"].values())
    bump("unit_cells_rewritten", changed)


def swap_locale(cell: str) -> str:
    if not re.fullmatch(r"-?[\d,]+(\.\d+)?", cell):
        return cell
    return cell.replace(",", "\0").replace(".", ",").replace("\0", ".")


@pytest.mark.parametrize("name", sorted(RAW) + sorted(DETAILS))
def test_a_comma_decimal_locale_gives_the_same_metrics(name: str) -> None:
    text = RAW.get(name) or DETAILS[name]
    pre, rows = table(text)
    swapped = [[swap_locale(c) for c in row] for row in rows]
    assert swapped != rows
    same(read_csv(text), read_csv(render(pre, swapped)))
    bump("locales")


@pytest.mark.parametrize("name", sorted(RAW) + sorted(DETAILS))
def test_na_cells_are_not_measured_never_invented(name: str) -> None:
    text = RAW.get(name) or DETAILS[name]
    base = read_csv(text)
    pre, rows = table(text)
    header = rows[0]
    # Metric cells only: the ID and the other fixed columns say which launch a row is.
    cols = [i for i, h in enumerate(header) if h == "Metric Value" or (
        "Metric Value" not in header and h not in ncu_reader._FIXED_COLUMNS)]
    rng = random.Random(name)
    for _ in range(20):
        blanked = [list(r) for r in rows]
        for row in blanked[1:]:
            for col in cols:
                if col < len(row) and rng.random() < 0.3 and num(row[col]) is not None:
                    row[col] = rng.choice(["n/a", "N/A", "", "-", "no data", "nan", "inf"])
        got = read_csv(render(pre, blanked))
        sane(got)
        for x, y in zip(base, got, strict=True):
            for key, v in y["metrics"].items():
                # Derived metrics may come from other counters; a direct one is either
                # what ncu measured or None.
                if key in ("duration_ns", "registers_per_thread", "achieved_occupancy_pct") \
                        and v is not None:
                    assert math.isclose(v, x["metrics"][key]), key
        bump("na_variants")


def truncations(text: str, count: int = 150) -> list[int]:
    rng = random.Random(len(text))
    return sorted({rng.randrange(len(text)) for _ in range(count)} | {0, 1, len(text) - 1})


def invented(full: list[dict[str, Any]], got: list[dict[str, Any]],
             skip: tuple[str, ...] = ()) -> list[str]:
    """Metrics a truncated read gives with a value the whole report does not have."""
    out = []
    for x, y in zip(full, got, strict=False):
        for key, v in y["metrics"].items():
            w = x["metrics"][key]
            if key not in skip and v is not None and (w is None or not math.isclose(v, w)):
                out.append(f"{x['kernel'][:30]} {key}: {v} (whole report: {w})")
    return out




@pytest.mark.parametrize("name", sorted(RAW) + sorted(DETAILS))
def test_truncated_csv_never_raises_or_invents_a_value(name: str) -> None:
    text = RAW.get(name) or DETAILS[name]
    full = read_csv(text)
    for cut in truncations(text):
        got = read_csv(text[:cut])
        sane(got)
        assert len(got) <= len(full)
        assert invented(full, got) == []
        bump("truncations")


def test_truncated_details_never_sum_part_of_shared_memory() -> None:
    text = DETAILS["gemm_details.csv"]
    full = read_csv(text)
    bad = [b for cut in truncations(text, 400)
           for b in invented(full, read_csv(text[:cut]))]
    assert bad == []


@pytest.mark.parametrize("text", [
    "", "\n", '"ID","Kernel Name"\n', '"ID","Kernel Name"\n"","",\n',
    "==PROF== No kernels were profiled.\n", "==ERROR== ERR_NVGPUCTRPERM - The user does not "
    "have permission to access NVIDIA GPU Performance Counters\n",
    '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n',
])
def test_empty_reports_give_nothing(text: str, tmp_path: Path) -> None:
    assert read_csv(text) == []
    path = tmp_path / "empty.csv"
    path.write_text(text)
    with pytest.raises(ReportError, match="holds no profiled kernel"):
        read_report_counted(path)
    bump("empty_reports")


def test_garbage_and_shuffled_lines_never_raise() -> None:
    rng = random.Random(9)
    sources = [*RAW.values(), *DETAILS.values(), *LOGS.values()]
    for _ in range(200):
        lines = rng.choice(sources).splitlines()
        k = rng.randrange(4)
        if k == 0:
            rng.shuffle(lines)
        elif k == 1:
            lines = [ln[: rng.randrange(len(ln) + 1)] for ln in lines]
        elif k == 2:
            lines = [ln.replace(",", rng.choice([";", "\t", ",,", '"'])) for ln in lines]
        else:
            lines = ["".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(80)))
                     for _ in range(30)] + lines[:5]
        text = "\n".join(lines)
        sane(read_csv(text))
        try:
            parse_kern_sum(text)
        except Tier2ParseError:
            pass
        parser = NcuConsoleParser("saxpy")
        with crash_counted():
            parser.feed(text)
            parser.close()
        bump("garbage_inputs")


@pytest.mark.parametrize("name", sorted(LOGS))
def test_console_in_any_chunking_or_truncation(name: str) -> None:
    text = LOGS[name]
    whole = NcuConsoleParser(None)
    with crash_counted():
        whole.feed(text)
        whole.close()
    rng = random.Random(name)
    for trial in range(60):
        p = NcuConsoleParser(None)
        body = text if trial % 2 == 0 else text[: rng.randrange(len(text) + 1)]
        pos = 0
        with crash_counted():
            while pos < len(body):
                step = rng.choice([1, 3, 17, 256, 4096])
                p.feed(body[pos:pos + step], rng.choice(["stdout", "stderr"])
                       if trial % 5 == 4 else "stdout")
                pos += step
            p.close()
        if body == text and trial % 5 != 4:
            assert p.summary() == whole.summary()  # chunking never changes what is read
        bump("console_variants")


def test_figures() -> None:
    # Every input above went through the readers inside crash_counted (this test runs
    # last in the file).
    assert CRASHES == [], CRASHES
    record("fuzz_ncu_output", inputs=sum(FIGURES.values()), crashes=len(CRASHES),
           **{k: v for k, v in sorted(FIGURES.items())})
