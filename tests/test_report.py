"""``gpuws report``: reading a pulled report or CSV on the laptop and showing it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from gpuws.errors import GpuwsError, UsageError
from gpuws.report import format_metric, read_report, render_report, report_json

FIXTURES = Path(__file__).parent / "fixtures" / "ncu-2025.3.1-h200"


def rendered(kernels: list[dict[str, Any]]) -> str:
    console = Console(record=True, width=140, color_system=None)
    render_report(kernels, console)
    return console.export_text()


def test_csv_reports_render_metrics_stalls_and_findings() -> None:
    raw = read_report(FIXTURES / "gemm_raw.csv")
    details = read_report(str(FIXTURES / "gemm_details.csv"))
    assert raw[0]["source"] == "ncu_csv_raw" and details[0]["source"] == "ncu_csv_details"
    out = rendered(raw + details)
    assert "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT" in out
    assert "1.639 ms" in out and "168" in out and "1.12 TFLOP" in out and "809 FLOP/B" in out
    assert "gmma" in out and "long scoreboard" in out
    # Findings are ordered by estimated speedup; those without one come last.
    order = [out.index(rule) for rule in ("MemoryL2Compression", "IssueSlotUtilization",
                                          "SOLBottleneck")]
    assert order == sorted(order)
    assert "15.6% (global)" in out
    # A value ncu did not give is shown as missing, not as zero.
    assert "Tensor pipe active" in out and "—" in out


def test_saxpy_numbers_as_a_person_reads_them() -> None:
    out = rendered(read_report(FIXTURES / "saxpy_raw.csv"))
    for text in ("246.5 µs", "66.3%", "100.0%", "1.0 KiB", "(262144, 1, 1)", "81.3"):
        assert text in out, text


def test_json_round_trip() -> None:
    kernels = read_report(FIXTURES / "saxpy_details.csv")
    assert json.loads(report_json(kernels)) == kernels
    kernels[0]["metrics"]["flops"] = float("nan")
    assert json.loads(report_json(kernels))[0]["metrics"]["flops"] is None


def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A stand-in ``ncu_report`` first on the bounded child's path (PYTHONPATH comes before
    site-packages): a fake, because no real module can be made to fail on cue."""
    site = tmp_path / "fake_site"
    site.mkdir(exist_ok=True)
    (site / "ncu_report.py").write_text(textwrap.dedent(body))
    monkeypatch.setenv("PYTHONPATH", str(site))


def test_ncu_rep_without_the_module_says_what_to_install(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "profile.ncu-rep"
    rep.write_bytes(b"NVR\x00 an NVIDIA binary report")
    fake_module(tmp_path, monkeypatch, "raise ImportError(\"No module named 'ncu_report'\")\n")
    with pytest.raises(GpuwsError) as info:
        read_report(rep)
    # The hint fits each way gpuws is installed.
    for form in ("pip install 'gpuws[report]'", "pipx inject gpuws ncu-report",
                 "uv tool install --with ncu-report gpuws", "--csv"):
        assert form in info.value.remedy
    assert "profile.ncu-rep" in info.value.one_line()


def test_ncu_rep_through_the_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "k.ncu-rep"
    rep.write_bytes(b"NVR\x00")
    fake_module(tmp_path, monkeypatch, """
        from types import SimpleNamespace as NS
        metric = NS(has_value=lambda: True, kind=lambda: 4, as_double=lambda: 1234.0,
                    unit=lambda: "ns")
        action = NS(name=lambda *base: "k(int)", metric_names=lambda: ("gpu__time_duration.sum",),
                    metric_by_name=lambda name: metric, rule_results_as_dicts=lambda: [])
        rng = NS(num_actions=lambda: 1, action_by_idx=lambda i: action)
        ctx = NS(num_ranges=lambda: 1, range_by_idx=lambda i: rng)
        def load_report(path):
            return ctx
        """)
    (kernel,) = read_report(rep)
    assert kernel["kernel"] == "k(int)" and kernel["metrics"]["duration_ns"] == 1234.0
    assert "1.2 µs" in rendered([kernel])


def test_missing_empty_and_profile_less_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        read_report(tmp_path / "nope.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(GpuwsError, match="no profiled kernel"):
        read_report(empty)
    no_kernels = tmp_path / "no_kernels.csv"
    no_kernels.write_text((FIXTURES / "no_kernels.txt").read_text())
    with pytest.raises(GpuwsError, match="no profiled kernel"):
        read_report(no_kernels)


def test_format_metric() -> None:
    """The report formats as every other face does (gpuws.text.humanfmt)."""
    assert format_metric("duration_ns", 246_528.0) == "246.5 µs"
    assert format_metric("duration_ns", 950.0) == "950 ns"
    assert format_metric("duration_ns", 2.5e9) == "2.500 s"
    assert format_metric("shared_mem_per_block", 189_660.0) == "185.2 KiB"
    assert format_metric("dram_bytes", 1.380e9) == "1.3 GiB"
    assert format_metric("flops", 1.12e12) == "1.12 TFLOP"
    assert format_metric("duration_ns", float("nan")) == "—"
    assert format_metric("l2_hit_pct", None) == "—"
    assert format_metric("registers_per_thread", 168.0) == "168"
    assert rendered([]).strip() == "no profiled kernels"


@pytest.mark.parametrize("name,sm,dram", [
    # What ncu measured on the H200 (tests/fixtures/README.md): its SpeedOfLight section
    # records the SM and DRAM frequency of each launch, raw page and details page alike.
    ("saxpy_raw.csv", "SM 1,479 MHz", "DRAM 3,199 MHz"),
    ("saxpy_details.csv", "SM 1,492 MHz", "DRAM 3,199 MHz"),
    ("gemm_raw.csv", "SM 1,345 MHz", "DRAM 3,199 MHz"),
    ("gemm_details.csv", "SM 1,350 MHz", "DRAM 3,200 MHz"),
])
def test_each_launch_shows_the_clocks_ncu_measured(name: str, sm: str, dram: str) -> None:
    (kernel,) = read_report(FIXTURES / name)
    out = rendered([kernel])
    assert f"{sm} · {dram}" in out
    assert json.loads(report_json([kernel]))[0]["clocks"]["sm_hz"] > 1e9


def test_clocks_of_a_real_ncu_rep() -> None:
    """The recorded H200 report, through the real ncu_report module (the report extra)."""
    pytest.importorskip("ncu_report")
    (kernel,) = read_report(Path(__file__).parent / "fixtures" / "recorded" / "saxpy_h200.ncu-rep")
    assert "SM 1,950 MHz · DRAM 3,198 MHz" in rendered([kernel])


def test_pod_text_in_a_report_is_never_markup(tmp_path: Path) -> None:
    """A kernel named like markup (a report is the pod's word) prints as itself."""
    (kernel,) = read_report(FIXTURES / "saxpy_raw.csv")
    kernel["kernel"] = "evil[/]k[bold]"
    kernel["rules"] = [{"kind": "[/]", "rule": "R[/]", "message": "m[/]", "est_speedup_pct": 1.0}]
    out = rendered([kernel])
    assert "evil[/]k[bold]" in out and "R[/]" in out and "m[/]" in out


RECORDED_REP = Path(__file__).parent / "fixtures" / "recorded" / "saxpy_h200.ncu-rep"


def test_a_report_gives_the_kernel_verdict_the_run_gave(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded H200 saxpy report read by `gpuws report`, and by a run's Tier 3 (the
    worker's code, with test_tier3_paths.py's stand-in ncu handing it that report): one
    verdict, word for word."""
    pytest.importorskip("ncu_report")
    from gpuws import protocol
    from gpuws.remote_agent import runs
    from gpuws.remote_agent.measure import tiers
    from gpuws.remote_agent.worker import RunContext
    from remote_agent.measure.test_tier3_paths import (  # type: ignore[import-not-found]
        FakePod,
        events,
        serving_ncu,
    )

    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-rep"))
    (rdir / "artifacts").mkdir(parents=True)
    spec = {"workload": "cmd:true", "tiers": [3]}
    (rdir / "spec.json").write_text(json.dumps(spec))
    ctx = RunContext("r-rep", spec, runs.EventLog("r-rep", str(rdir / "events.ndjson")).append)
    tiers.tier3(ctx, FakePod([serving_ncu(tmp_path / "ncu")]), ["/bin/true"], None, "saxpy",
                python=False)
    stated = next(e for e in events(ctx) if isinstance(e, protocol.KernelVerdict))
    (kernel,) = read_report(RECORDED_REP)
    verdict = kernel["verdict"]
    assert verdict["bound"] == "dram" and verdict["counters"] is True
    envelope = ("type", "run_id", "seq", "ts", "req")
    assert verdict == {k: v for k, v in msgspec.to_builtins(stated).items()
                       if k not in envelope}
    out = rendered([kernel])
    assert "Verdict: " + verdict["sentence"] in " ".join(out.split())


def test_report_json_carries_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ncu_report")
    from gpuws.cli import main

    assert main(["report", str(RECORDED_REP), "--json"]) == 0
    (launch,) = json.loads(capsys.readouterr().out)
    assert launch["verdict"]["bound"] == "dram"
    assert launch["verdict"]["sentence"].startswith("DRAM bandwidth-bound")


def test_only_each_kernels_first_launch_carries_a_verdict() -> None:
    # A CSV of two launches of one kernel: one verdict, as the run states one per kernel.
    (one,) = read_report(FIXTURES / "saxpy_raw.csv")
    two = [one, dict(one, launch=1)]
    for k in two:
        k.pop("verdict", None)
    from gpuws.report import add_verdicts

    add_verdicts(two)
    assert "verdict" in two[0] and "verdict" not in two[1]
