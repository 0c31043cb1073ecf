"""The Tier-3 ncu command line and the parsers of ``ncu --list-sets`` / ``--list-sections``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuws.remote_agent.profilers.ncu_cmd import (
    DEFAULT_SECTIONS,
    build_ncu_argv,
    parse_list_sections,
    parse_list_sets,
    validate_selection,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"

# Real output of Nsight Compute 2025.3.1 on the fixtures' H200 (trailing blanks removed;
# long lines split in two literals only to fit this file). The Sections cell wraps at its
# column width, inside words ("MemoryWorkloa" / "dAnalysis_Chart").
LIST_SETS_2025_3_1 = "\n".join([
    ('---------- -------------------------------------------------------------------------'
     '-- ------- -----------------'),
    ('Identifier Sections                                                                 '
     '   Enabled Estimated Metrics'),
    ('---------- -------------------------------------------------------------------------'
     '-- ------- -----------------'),
    ('basic      LaunchStats, Occupancy, SpeedOfLight, WorkloadDistribution               '
     '   yes     213'),
    ('detailed   ComputeWorkloadAnalysis, LaunchStats, MemoryWorkloadAnalysis, MemoryWorkl'
     'oa no      906'),
    ('           dAnalysis_Chart, Occupancy, SourceCounters, SpeedOfLight, SpeedOfLight_Ro'
     'of'),
    '           lineChart, WorkloadDistribution',
    ('full       ComputeWorkloadAnalysis, InstructionStats, LaunchStats, MemoryWorkloadAna'
     'ly no      7794'),
    ('           sis, MemoryWorkloadAnalysis_Chart, MemoryWorkloadAnalysis_Tables, NumaAff'
     'in'),
    ('           ity, Nvlink_Tables, Nvlink_Topology, Occupancy, PmSampling, SchedulerStat'
     's,'),
    ('            SourceCounters, SpeedOfLight, SpeedOfLight_HierarchicalDoubleRooflineCha'
     'rt'),
    ('           , SpeedOfLight_HierarchicalHalfRooflineChart, SpeedOfLight_HierarchicalSi'
     'ng'),
    ('           leRooflineChart, SpeedOfLight_HierarchicalTensorRooflineChart, SpeedOfLig'
     'ht'),
    '           _RooflineChart, WarpStateStats, WorkloadDistribution',
    ('nvlink     Nvlink, Nvlink_Tables, Nvlink_Topology                                   '
     '   no      122'),
    ('pmsampling PmSampling, PmSampling_WarpStates                                        '
     '   no      411'),
    ('roofline   SpeedOfLight, SpeedOfLight_HierarchicalDoubleRooflineChart, SpeedOfLight_'
     'Hi no      6649'),
    ('           erarchicalHalfRooflineChart, SpeedOfLight_HierarchicalSingleRooflineChart'
     ','),
    ('           SpeedOfLight_HierarchicalTensorRooflineChart, SpeedOfLight_RooflineChart,'
     ' W'),
    '           orkloadDistribution',
])

LIST_SECTIONS_2025_3_1 = "\n".join([
    ('-------------------------------------------- ---------------------------------------'
     '-------------------------- ------- -------------------------------------------------'
     '-'),
    ('Identifier                                   Display Name                           '
     '                           Enabled Filename'),
    ('-------------------------------------------- ---------------------------------------'
     '-------------------------- ------- -------------------------------------------------'
     '-'),
    ('C2CLink                                      C2CLink                                '
     '                           no      ...sight Compute/2025.3.1/Sections/C2CLink.sectio'
     'n'),
    ('ComputeWorkloadAnalysis                      Compute Workload Analysis              '
     '                           no      ...25.3.1/Sections/ComputeWorkloadAnalysis.sectio'
     'n'),
    ('InstructionStats                             Instruction Statistics                 '
     '                           no      ...2025.3.1/Sections/InstructionStatistics.sectio'
     'n'),
    ('LaunchStats                                  Launch Statistics                      '
     '                           yes     ...pute/2025.3.1/Sections/LaunchStatistics.sectio'
     'n'),
    ('MemoryWorkloadAnalysis                       Memory Workload Analysis               '
     '                           no      ...025.3.1/Sections/MemoryWorkloadAnalysis.sectio'
     'n'),
    ('MemoryWorkloadAnalysis_Chart                 Memory Workload Analysis Chart         '
     '                           no      ...1/Sections/MemoryWorkloadAnalysis_Chart.sectio'
     'n'),
    ('MemoryWorkloadAnalysis_Tables                Memory Workload Analysis Tables        '
     '                           no      .../Sections/MemoryWorkloadAnalysis_Tables.sectio'
     'n'),
    ('NumaAffinity                                 NUMA Affinity                          '
     '                           no      ... Compute/2025.3.1/Sections/NumaAffinity.sectio'
     'n'),
    ('Nvlink                                       NVLink                                 '
     '                           no      ...Nsight Compute/2025.3.1/Sections/Nvlink.sectio'
     'n'),
    ('Nvlink_Tables                                NVLink Tables                          '
     '                           no      ...Compute/2025.3.1/Sections/Nvlink_Tables.sectio'
     'n'),
    ('Nvlink_Topology                              NVLink Topology                        '
     '                           no      ...mpute/2025.3.1/Sections/Nvlink_Topology.sectio'
     'n'),
    ('Occupancy                                    Occupancy                              '
     '                           yes     ...ght Compute/2025.3.1/Sections/Occupancy.sectio'
     'n'),
    ('PmSampling                                   PM Sampling                            '
     '                           no      ...ht Compute/2025.3.1/Sections/PmSampling.sectio'
     'n'),
    ('PmSampling_WarpStates                        PM Sampling: Warp States               '
     '                           no      ...2025.3.1/Sections/PmSampling_WarpStates.sectio'
     'n'),
    ('SchedulerStats                               Scheduler Statistics                   '
     '                           no      ...e/2025.3.1/Sections/SchedulerStatistics.sectio'
     'n'),
    ('SourceCounters                               Source Counters                        '
     '                           no      ...ompute/2025.3.1/Sections/SourceCounters.sectio'
     'n'),
    ('SpeedOfLight                                 GPU Speed Of Light Throughput          '
     '                           yes     ... Compute/2025.3.1/Sections/SpeedOfLight.sectio'
     'n'),
    ('SpeedOfLight_HierarchicalDoubleRooflineChart GPU Speed Of Light Hierarchical Rooflin'
     'e Chart (Double Precision) no      ...OfLight_HierarchicalDoubleRooflineChart.sectio'
     'n'),
    ('SpeedOfLight_HierarchicalHalfRooflineChart   GPU Speed Of Light Hierarchical Rooflin'
     'e Chart (Half Precision)   no      ...edOfLight_HierarchicalHalfRooflineChart.sectio'
     'n'),
    ('SpeedOfLight_HierarchicalSingleRooflineChart GPU Speed Of Light Hierarchical Rooflin'
     'e Chart (Single Precision) no      ...OfLight_HierarchicalSingleRooflineChart.sectio'
     'n'),
    ('SpeedOfLight_HierarchicalTensorRooflineChart GPU Speed Of Light Hierarchical Rooflin'
     'e Chart (Tensor Core)      no      ...OfLight_HierarchicalTensorRooflineChart.sectio'
     'n'),
    ('SpeedOfLight_RooflineChart                   GPU Speed Of Light Roofline Chart      '
     '                           no      ...3.1/Sections/SpeedOfLight_RooflineChart.sectio'
     'n'),
    ('WarpStateStats                               Warp State Statistics                  '
     '                           no      ...e/2025.3.1/Sections/WarpStateStatistics.sectio'
     'n'),
    ('WorkloadDistribution                         GPU and Memory Workload Distribution   '
     '                           yes     .../2025.3.1/Sections/WorkloadDistribution.sectio'
     'n'),
])


def argv(**kw: object) -> list[str]:
    args: dict[str, object] = {
        "report_path": "/runs/r1/profile", "target_argv": ["python3", "bench.py", "--n", "8"],
        "kernel_regex": "saxpy", "launch_skip": 2, "launch_count": 3, "ncu_set": None,
        "sections": None, "replay_mode": None, "clock_control": "base", "cache_control": "all",
    }
    args.update(kw)
    return build_ncu_argv("/opt/nvidia/nsight-compute/2025.3.1/ncu", **args)  # type: ignore[arg-type]


def pairs(av: list[str], flag: str) -> list[str]:
    return [av[i + 1] for i, a in enumerate(av) if a == flag]


def test_default_sections_are_real_identifiers() -> None:
    known = {s["identifier"] for s in parse_list_sections(LIST_SECTIONS_2025_3_1)}
    assert set(DEFAULT_SECTIONS) <= known
    # The details CSV names sections by identifier in its rule rows: the same spelling.
    with (FIXTURES / "saxpy_details.csv").open() as f:
        rows = [r for r in csv.reader(f) if len(r) > 15 and r[15] and r[0] != "ID"]
    assert {r[11] for r in rows} <= set(DEFAULT_SECTIONS)
    assert {"SpeedOfLight", "WarpStateStats", "Occupancy"} <= {r[11] for r in rows}


def test_targeted_command_line() -> None:
    av = argv()
    assert av[0] == "/opt/nvidia/nsight-compute/2025.3.1/ncu"
    assert av[-4:] == ["python3", "bench.py", "--n", "8"]
    assert pairs(av, "--kernel-name-base") == ["demangled"]
    assert pairs(av, "-k") == ["regex:saxpy"]
    assert pairs(av, "--target-processes") == ["all"]
    assert pairs(av, "--launch-skip") == ["2"] and pairs(av, "--launch-count") == ["3"]
    assert pairs(av, "--clock-control") == ["base"] and pairs(av, "--cache-control") == ["all"]
    assert pairs(av, "-o") == ["/runs/r1/profile"] and "-f" in av
    assert pairs(av, "--section") == list(DEFAULT_SECTIONS)
    assert "--set" not in av and "--replay-mode" not in av and "--metrics" not in av
    # The target's own argv comes after every ncu option.
    assert av.index("-f") < av.index("python3")


def test_regex_prefix_sets_sections_metrics_and_replay() -> None:
    assert pairs(argv(kernel_regex="regex:gemm|nvjet"), "-k") == ["regex:gemm|nvjet"]
    assert pairs(argv(kernel_regex=None), "-k") == ["regex:.*"]
    full = argv(ncu_set="full", replay_mode="application", clock_control="none")
    assert pairs(full, "--set") == ["full"] and "--section" not in full
    assert pairs(full, "--replay-mode") == ["application"]
    assert pairs(full, "--clock-control") == ["none"]
    both = argv(ncu_set="basic", sections=["WarpStateStats"])
    assert pairs(both, "--set") == ["basic"] and pairs(both, "--section") == ["WarpStateStats"]
    timing = argv(metrics=["gpu__time_duration.sum", "dram__bytes.sum"])
    # Metrics alone: one cheap pass, no default sections.
    assert pairs(timing, "--metrics") == ["gpu__time_duration.sum,dram__bytes.sum"]
    assert "--section" not in timing


@pytest.mark.parametrize("bad", [
    {"clock_control": "reset"}, {"cache_control": "some"}, {"replay_mode": "graph"},
    {"launch_skip": -1}, {"launch_count": 0}, {"target_argv": []},
])
def test_refuses_what_ncu_would_refuse(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        argv(**bad)


def test_parse_list_sets_real_output() -> None:
    sets = {s["identifier"]: s for s in parse_list_sets(LIST_SETS_2025_3_1)}
    assert list(sets) == ["basic", "detailed", "full", "nvlink", "pmsampling", "roofline"]
    assert sets["basic"] == {"identifier": "basic", "enabled": True, "estimated_metrics": 213,
                             "sections": ["LaunchStats", "Occupancy", "SpeedOfLight",
                                          "WorkloadDistribution"]}
    detailed = sets["detailed"]["sections"]
    assert "MemoryWorkloadAnalysis_Chart" in detailed  # rejoined across a mid-word wrap
    assert "SpeedOfLight_RooflineChart" in detailed and len(detailed) == 9
    full = sets["full"]
    assert full["estimated_metrics"] == 7794 and full["enabled"] is False
    assert len(full["sections"]) == 21
    assert {"SpeedOfLight_HierarchicalSingleRooflineChart", "WarpStateStats",
            "SourceCounters", "NumaAffinity"} <= set(full["sections"])
    assert set(DEFAULT_SECTIONS) <= set(full["sections"])
    # Every section a set names is a section this ncu lists.
    known = {s["identifier"] for s in parse_list_sections(LIST_SECTIONS_2025_3_1)}
    assert all(set(s["sections"]) <= known for s in sets.values())


def test_parse_list_sets_tolerates_padding_and_indent() -> None:
    # Some builds indent the table by a blank; padded lines must read the same.
    indented = "\n".join(" " + line.ljust(112) for line in LIST_SETS_2025_3_1.splitlines())
    assert parse_list_sets(indented) == parse_list_sets(LIST_SETS_2025_3_1)
    assert parse_list_sets("") == []
    assert parse_list_sets("==ERROR== something went wrong\n") == []


def test_parse_list_sections_real_output() -> None:
    sections = parse_list_sections(LIST_SECTIONS_2025_3_1)
    assert len(sections) == 24
    by_id = {s["identifier"]: s for s in sections}
    assert by_id["SpeedOfLight"]["display_name"] == "GPU Speed Of Light Throughput"
    assert by_id["SpeedOfLight"]["enabled"] is True
    assert by_id["WarpStateStats"]["enabled"] is False
    assert by_id["C2CLink"]["filename"] == "...sight Compute/2025.3.1/Sections/C2CLink.section"
    assert by_id["SpeedOfLight_HierarchicalDoubleRooflineChart"]["display_name"] == (
        "GPU Speed Of Light Hierarchical Roofline Chart (Double Precision)")


def test_validate_selection() -> None:
    sets = [s["identifier"] for s in parse_list_sets(LIST_SETS_2025_3_1)]
    sections = [s["identifier"] for s in parse_list_sections(LIST_SECTIONS_2025_3_1)]
    assert validate_selection("full", DEFAULT_SECTIONS, sets, sections) == []
    assert validate_selection(None, ["regex:Roofline"], sets, sections) == []
    problems = validate_selection("default", ["warpstatestats", "NoSuchSection"], sets, sections)
    assert len(problems) == 3
    assert "'basic'" in problems[0]  # the old set name
    assert "did you mean 'WarpStateStats'" in problems[1]
    assert "NoSuchSection" in problems[2]
