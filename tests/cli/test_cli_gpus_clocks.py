"""Every GPU, and the clocks behind every figure, as the headless commands show them.

``gpuws run --gpu`` refused before connecting (exit 2, the valid forms) and, once the
pod's probe is known, a GPU the pod lacks refused with its list (a real local agent);
the run printer naming a busy GPU on stderr and printing the clocks and caution beside
the Tier-1 figure; ``gpuws compare`` of runs on different GPUs, drivers and clocks;
``gpuws export``; ``gpuws doctor``'s table and JSON of every GPU.

The runs are the realistic streams of ``tests/sessions/recorded.py`` (the real H200
fixtures) with what an agent of this round adds: ``RunStarted.gpu`` and
``Tier1Result.clocks``. Their numbers are real readings: the H200's 345 MHz idle and
1,980 MHz boost clock and 3,201 MHz memory clock (its ``nvidia-smi -q -x``), and the
RTX A5000s of ``tests/fixtures/nvidia-smi/`` (2,100 MHz top SM clock, 8,001 MHz memory
clock, driver 590.44.01, a llama-server on each GPU).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import msgspec
import pytest
from rich.console import Console

from gpuws import protocol
from gpuws.cli import main
from gpuws.commands import doctor
from gpuws.commands.run import Printer
from gpuws.errors import UsageError
from gpuws.live.feed import Batch
from gpuws.sessions.compare import compare_runs
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from multigpu import A5000_X2, K80_X4, probe  # type: ignore[import-not-found]


def _load_recorded() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpuws_gpus_clocks_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()
NOWHERE = "no-such-pod.invalid"

#: The H200 while Tier 1 sampled a cold start: the first samples at the idle clock.
H200_COLD = {"samples": 40, "sm_mhz_min": 345.0, "sm_mhz_median": 1980.0,
             "sm_mhz_max": 1980.0, "sm_mhz_ceiling": 1980.0, "mem_mhz_min": 3201.0,
             "mem_mhz_max": 3201.0, "clock_events": []}
#: An RTX A5000 at its top SM clock throughout, its memory at the top clock.
A5000_STEADY = {"samples": 40, "sm_mhz_min": 2100.0, "sm_mhz_median": 2100.0,
                "sm_mhz_max": 2100.0, "sm_mhz_ceiling": 2100.0, "mem_mhz_min": 8001.0,
                "mem_mhz_max": 8001.0, "clock_events": []}


def with_round14(lines: list[bytes], clocks: dict[str, Any] | None,
                 gpu: dict[str, Any] | None) -> list[bytes]:
    """A recorded run's lines with ``Tier1Result.clocks`` and ``RunStarted.gpu`` set."""
    out = []
    for line in lines:
        event = json.loads(line)
        if event["type"] == "tier1_result" and clocks is not None:
            event["clocks"] = clocks
        if event["type"] == "run_started" and gpu is not None:
            event["gpu"] = gpu
        out.append(json.dumps(event).encode())
    return out


def _events(lines: list[bytes]) -> list[protocol.Events]:
    events = [protocol.decode_event(line) for line in lines]
    assert not any(isinstance(e, protocol.BadLine) for e in events)
    return events  # type: ignore[return-value]


# ----------------------------------------------------------------------------- --gpu
@pytest.mark.parametrize("gpu,says", [
    ("64", "--gpu 64: there is no GPU index above 63"),
    ("0,1", "--gpu 0,1: a run uses one GPU"),
    ("h200", "--gpu h200 is not a GPU index or UUID"),
    ("GPU-zz", "--gpu GPU-zz is not a GPU index or UUID"),
])
def test_a_bad_gpu_is_refused_before_connecting(gpu: str, says: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", NOWHERE, "-w", "builtin:saxpy", "--gpu", gpu]) == UsageError.exit_code
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("gpuws: Usage error: ") and says in line
    assert "an index 0..63" in line and "GPU-2a311d9d-…" in line


def test_a_gpu_the_pod_lacks_is_refused_once_its_probe_is_known(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The real agent on this machine (which has no GPU): refused before start_run."""
    assert main(["run", "local", "-w", "cmd:true", "--gpu", "1"]) == UsageError.exit_code
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "--gpu 1: the pod has no GPU" in line
    with Store() as store:
        (session,) = store.sessions()
        assert store.runs(session.id) == []  # nothing was started


# ----------------------------------------------------------------------------- printer
def test_the_printer_names_a_busy_gpu_and_the_clocks_behind_the_figure(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    llama = {"pid": 100477, "name": "/root/src/llama.cpp/build/bin/llama-server",
             "used_mib": 22430.0}
    lines = with_round14(RECORDED.saxpy_run("20261121-120000-aaaaaa", tiers=(1,)), H200_COLD,
                         {"index": 0, "uuid": "GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad",
                          "name": "NVIDIA H200", "busy": [llama]})
    events = _events(lines)
    Printer(as_json=False).batch(Batch(events, [0.0] * len(events), len(events)))
    captured = capsys.readouterr()
    assert "(GPU 0 (NVIDIA H200))" in captured.out
    (warning,) = captured.err.strip().splitlines()
    assert warning.startswith("gpuws: warning: GPU 0 (NVIDIA H200) is busy: 1 other process "
                              "uses it (pid 100477 llama-server (21.9 GiB))")
    assert "clocks: SM 345–1,980 MHz (median 1,980), mem 3,201 MHz" in captured.out
    assert "! caution: the SM clock varied 345–1,980 MHz while sampling (83% of its median)" \
        in captured.out
    # Numbers for people: the 0.240 ms median as µs, never 0.2404 ms.
    assert re.search(r"│\s+2\d\d\.\d µs\s+│", captured.out)
    assert not re.search(r"\d\.\d{4} ms", captured.out)

    # JSON keeps stdout NDJSON; the warning still goes to stderr.
    Printer(as_json=True).batch(Batch(events, [0.0] * len(events), len(events)))
    captured = capsys.readouterr()
    assert all(json.loads(line) for line in captured.out.splitlines())
    assert "is busy" in captured.err


def test_a_run_without_clocks_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    events = _events(RECORDED.saxpy_run("20261121-120000-bbbbbb", tiers=(1,)))
    Printer(as_json=False).batch(Batch(events, [0.0] * len(events), len(events)))
    out = capsys.readouterr().out
    assert "clocks not recorded" in out and "caution" not in out


# ----------------------------------------------------------------------------- compare
def _two_pods() -> dict[str, str]:
    """An H200 session and an RTX A5000 session, a saxpy run on each, and an old run."""
    ids = {"h200": "20261121-120000-h200aa", "a5000": "20261121-120100-a5000b",
           "old": "20261121-120200-oldccc"}
    h200 = msgspec.convert(RECORDED.probe(), protocol.Probe)
    a5000 = probe(A5000_X2)
    with Store() as store:
        s1 = store.open_session("h200", "ssh+sftp", h200, 3.99, started=RECORDED.T0 - 10)
        store.ingest_many(s1, with_round14(
            RECORDED.saxpy_run(ids["h200"], median_ms=0.240, seed=1), H200_COLD,
            {"index": 0, "uuid": h200.gpus[0].uuid, "name": "NVIDIA H200", "busy": []}))
        store.ingest_many(s1, RECORDED.saxpy_run(ids["old"], t0=RECORDED.T0 + 30,
                                                 median_ms=0.240, seed=3))
        s2 = store.open_session("a5000", "ssh+sftp", a5000, 0.25, started=RECORDED.T0 + 50)
        store.ingest_many(s2, with_round14(
            RECORDED.saxpy_run(ids["a5000"], t0=RECORDED.T0 + 60, median_ms=1.050, seed=2),
            A5000_STEADY, {"index": 1, "uuid": a5000.gpus[1].uuid, "name": "NVIDIA RTX A5000",
                           "busy": [msgspec.to_builtins(p) for p in a5000.gpus[1].processes
                                    or []]}))
    return ids


def test_compare_across_gpus_says_what_differs_and_adds_the_cycle_ratio(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    ids = _two_pods()
    assert main(["compare", ids["h200"], ids["a5000"], "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    time_ratio = c["tier1"]["speedup"]
    # cycles = median time × median SM clock; the ratio is A's cycles over B's.
    expected = (c["tier1"]["median_a_ms"] * 1980.0) / (c["tier1"]["median_b_ms"] * 2100.0)
    assert c["cycle_ratio"] == pytest.approx(expected)
    assert c["cycle_ratio"] == pytest.approx(time_ratio * 1980.0 / 2100.0)
    assert c["gpu_a"]["name"] == "NVIDIA H200" and c["gpu_b"]["name"] == "NVIDIA RTX A5000"
    assert c["gpu_b"]["index"] == 1
    assert c["differences"] == [
        "different GPUs: A NVIDIA H200 vs B NVIDIA RTX A5000",
        "different drivers: A 580.159.04 vs B 590.44.01",
        "different SM clocks: A median 1,980 MHz vs B 2,100 MHz"]
    assert c["clock_caution_a"].startswith("the SM clock varied 345–1,980 MHz")
    assert c["clock_caution_b"] == ""

    assert main(["compare", ids["h200"], ids["a5000"]]) == 0
    out = capsys.readouterr().out
    for line in c["differences"]:
        assert line in out
    assert "cycle-space ratio" in out and "time × median SM clock" in out
    assert f"{c['cycle_ratio']:.3f}×" in out
    assert "caution (A): the SM clock varied" in out
    assert "SM 2,100 MHz, mem 8,001 MHz" in out


def test_compare_with_an_old_run_never_invents_clocks(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
    ids = _two_pods()
    assert main(["compare", ids["old"], ids["h200"], "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["cycle_ratio"] is None and c["clocks_a"] is None
    assert c["differences"] == ["clocks recorded for B only (A: clocks not recorded): the "
                                "clock difference cannot be taken out"]
    assert main(["compare", ids["old"], ids["h200"]]) == 0
    out = capsys.readouterr().out
    assert "clocks not recorded" in out and "cycle-space" not in out


def test_export_carries_the_clocks_the_gpu_and_the_caution() -> None:
    ids = _two_pods()
    with Store() as store:
        h200 = export_session(store, store.run(ids["h200"]).session_id)
        a5000 = export_session(store, store.run(ids["a5000"]).session_id)
        store.set_baseline_of(ids["a5000"], ids["h200"])
        compared = export_session(store, store.run(ids["a5000"]).session_id)
        c = compare_runs(store, ids["h200"], ids["a5000"])
    assert ("Clocks while sampling: SM 345–1,980 MHz (median 1,980), mem 3,201 MHz."
            in h200)
    assert "**Caution:** the SM clock varied 345–1,980 MHz while sampling" in h200
    assert "Clocks while sampling: not recorded." in h200  # the old run
    assert "Ran on GPU 0 (NVIDIA H200), `GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad`." in h200
    assert "Ran on GPU 1 (NVIDIA RTX A5000)" in a5000
    assert "**Caution:** GPU 1 (NVIDIA RTX A5000) is busy: 1 other process uses it" in a5000
    assert "| GPU 1 in use by | pid 100477 llama-server (16.8 GiB) |" in a5000
    assert "**Not like for like:** different GPUs: A NVIDIA H200 vs B NVIDIA RTX A5000." \
        in compared
    assert "**Caution (baseline):** the SM clock varied" in compared
    assert c.cycle_note[:1].upper() + c.cycle_note[1:] + "." in compared


# ----------------------------------------------------------------------------- doctor
def _report(p: protocol.Probe) -> dict[str, Any]:
    # What doctor_report reads off a connected client: its transport and deploy facts.
    # A stand-in: no pod with these GPUs can be reached from here.
    client: Any = SimpleNamespace(
        transport=SimpleNamespace(info=SimpleNamespace(kind="ssh", sftp=True, notes=[],
                                                       connect_s=0.2)),
        hello=SimpleNamespace(agent_version="0.1.0", agent_sha256="0" * 64),
        deploy=SimpleNamespace(cache_state="hit", bundle_size=1000, transferred=0,
                               deploy_s=0.05))
    return doctor.doctor_report("k80-pod", client, p, 1.0)


def test_doctor_lists_every_gpu_with_who_uses_it(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    k80 = probe(K80_X4)
    report = _report(k80)
    assert [g["index"] for g in report["gpus"]] == [0, 1, 2, 3]
    assert [len(g["processes"]) for g in report["gpus"]] == [1, 1, 0, 0]
    assert report["gpus"][0]["clock_events"] == ["applications_clocks_setting"]
    json.dumps(report)  # the --json output is plain JSON
    doctor.render(report)
    out = capsys.readouterr().out
    assert "GPUs (4)" in out and out.count("Tesla K80") == 4
    assert out.count("pid 58813 python") == 1 and out.count("pid 58642 python") == 1
    assert "application clocks set" in out
    assert not re.search(r"\d\.\d{3,} ?MiB", out)  # numbers for people


def test_doctor_never_reads_pod_text_as_markup(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    k80 = probe(K80_X4)
    hostile = msgspec.structs.replace(k80, hostname="evil[/]host", gpus=[
        msgspec.structs.replace(k80.gpus[0], name="Tesla[/bold]K80",
                                processes=[protocol.GpuProcess(pid=7, name="x[bold]y")])])
    doctor.render(_report(hostile))
    out = capsys.readouterr().out
    assert "evil[/]host" in out and "Tesla[/bold]K80" in out and "x[bold]y" in out


def test_gpu_table_renders_the_a5000s() -> None:
    console = Console(record=True, width=200, color_system=None)
    console.print(doctor.gpu_table(probe(A5000_X2).gpus))
    out = console.export_text()
    assert "21.9 GiB / 24.0 GiB" in out and "210 / 2,100 MHz" in out
    assert "7 / 230 W" in out and "13 °C" in out and "idle" in out
    assert "pid 100477 llama-server (21.9 GiB)" in out
