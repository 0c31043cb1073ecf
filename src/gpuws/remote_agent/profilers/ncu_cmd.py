"""The Tier-3 ncu command line, and parsers for ``ncu --list-sets`` / ``--list-sections``.

The command is always targeted: demangled names for ``-k regex:…``, child processes
followed, explicit clock and cache control (their defaults changed between versions), and
a report file (``-o … -f``) that the reader opens afterwards. The list parsers read the
fixed-width tables ncu prints, whose long cells wrap onto continuation lines, so the set
and section names a person asks for can be checked before a long run starts.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "CACHE_CONTROLS",
    "CLOCK_CONTROLS",
    "DEFAULT_SECTIONS",
    "NAME_BASES",
    "REPLAY_MODES",
    "build_ncu_argv",
    "parse_list_sections",
    "parse_list_sets",
    "validate_selection",
]

#: The focused default of the design: section identifiers as ``ncu --list-sections`` prints
#: them (2025.3.1); the details CSV of the fixtures names the same identifiers in its rule rows.
DEFAULT_SECTIONS = (
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis",
    "WarpStateStats",
    # The roofline inputs (FLOPs by precision, tensor ops, DRAM bytes): without them a
    # kernel cannot be placed on the pod's roofline. They add few metrics, no full set.
    "SpeedOfLight_RooflineChart",
    "SpeedOfLight_HierarchicalTensorRooflineChart",
)

#: Values ``--clock-control`` accepts for a profile (``reset`` only resets clocks and exits).
CLOCK_CONTROLS = ("base", "none")
CACHE_CONTROLS = ("all", "none")
REPLAY_MODES = ("kernel", "application", "range", "app-range")
#: Values of ``--kernel-name-base``: the name a ``-k`` filter is matched against.
NAME_BASES = ("demangled", "function", "mangled")


def build_ncu_argv(
    ncu: str,
    *,
    report_path: str,
    target_argv: Sequence[str],
    kernel_regex: str | None,
    launch_skip: int,
    launch_count: int,
    ncu_set: str | None,
    sections: Sequence[str] | None,
    replay_mode: str | None,
    clock_control: str,
    cache_control: str,
    metrics: Sequence[str] | None = None,
    device_args: Sequence[str] = (),
    name_base: str = "demangled",
) -> list[str]:
    """The argv of one targeted ncu profile.

    Args:
        ncu: path of the ncu executable.
        report_path: where ``-o`` writes the report (ncu appends ``.ncu-rep`` if missing).
        target_argv: the workload's own argv.
        kernel_regex: a regex over demangled names (a leading ``regex:`` is accepted);
            None profiles every kernel.
        launch_skip: matching launches to skip first (``-s``).
        launch_count: matching launches to profile (``-c``), at least 1.
        ncu_set: a section set (``--set``), or None.
        sections: section identifiers (``--section`` each), or None.
        replay_mode: ``kernel``, ``application``, ``range`` or ``app-range``; None keeps
            ncu's default (kernel).
        clock_control: ``base`` (lock to base clocks) or ``none``.
        cache_control: ``all`` (flush caches between passes) or ``none``.
        metrics: extra metric names (``--metrics``).
        device_args: ncu's device filter for a run pinned to one GPU
            (``gpusel.ncu_device_args``: ``--devices 0``), placed before the target.
        name_base: which of ncu's names the regex is matched against
            (``--kernel-name-base``): ``demangled`` (the default here), ``function`` (the
            bare function name) or ``mangled``.

    Returns:
        The argv list. Without a set, sections or metrics, :data:`DEFAULT_SECTIONS` are
        collected; metrics alone collect only those metrics (a cheap one-pass timing).

    Raises:
        ValueError: for an option value ncu would refuse.
    """
    if clock_control not in CLOCK_CONTROLS:
        raise ValueError(f"clock_control must be one of {CLOCK_CONTROLS}, not {clock_control!r}")
    if cache_control not in CACHE_CONTROLS:
        raise ValueError(f"cache_control must be one of {CACHE_CONTROLS}, not {cache_control!r}")
    if replay_mode is not None and replay_mode not in REPLAY_MODES:
        raise ValueError(f"replay_mode must be one of {REPLAY_MODES}, not {replay_mode!r}")
    if name_base not in NAME_BASES:
        raise ValueError(f"name_base must be one of {NAME_BASES}, not {name_base!r}")
    if launch_skip < 0:
        raise ValueError(f"launch_skip must be >= 0, not {launch_skip}")
    if launch_count < 1:
        raise ValueError(f"launch_count must be >= 1, not {launch_count}")
    if not target_argv:
        raise ValueError("target_argv is empty: nothing to profile")
    regex = kernel_regex or ".*"
    if regex.startswith("regex:"):
        regex = regex[len("regex:"):]
    if not regex:
        regex = ".*"

    argv = [
        ncu,
        "--target-processes", "all",
        *device_args,
        "--kernel-name-base", name_base,
        "-k", "regex:" + regex,
        "--launch-skip", str(launch_skip),
        "--launch-count", str(launch_count),
    ]
    if ncu_set:
        argv += ["--set", ncu_set]
    chosen = list(sections or [])
    if not ncu_set and not chosen and not metrics:
        chosen = list(DEFAULT_SECTIONS)
    for section in chosen:
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    if replay_mode:
        argv += ["--replay-mode", replay_mode]
    argv += [
        "--clock-control", clock_control,
        "--cache-control", cache_control,
        "-o", report_path,
        "-f",
    ]
    argv += list(target_argv)
    return argv


def _columns(rule: str) -> list[tuple[int, int]]:
    """Column spans from a ``---- ------ --`` rule line."""
    return [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]


def _is_rule(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and set(stripped) <= {"-", " "} and "--" in stripped


def _table_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """Header cells and rows of one of ncu's fixed-width tables.

    A row whose first cell is empty continues the row above: each of its cells is
    appended to the cell above it, character for character (ncu wraps cells at the
    column width, even inside a word).
    """
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _is_rule(line)]
    if len(rules) < 2:
        return [], []
    spans = _columns(lines[rules[0]])
    header_line = lines[rules[0] + 1] if rules[0] + 1 < rules[1] else ""

    def cut(line: str) -> list[str]:
        cells = []
        for i, (start, end) in enumerate(spans):
            # The last column runs to the end of the line: its text may be wider than its rule.
            stop = spans[i + 1][0] if i + 1 < len(spans) else len(line)
            cells.append(line[start:max(stop, end)])
        return cells

    header = [c.strip() for c in cut(header_line)]
    rows: list[list[str]] = []
    end = rules[2] if len(rules) > 2 else len(lines)
    for line in lines[rules[1] + 1:end]:
        if not line.strip() or line.startswith("=="):
            continue
        cells = cut(line)
        if rows and not cells[0].strip():
            # (zip(strict=) is 3.10+; both lists have one cell per column anyway.)
            rows[-1] = [rows[-1][i] + cells[i] for i in range(len(cells))]
        else:
            rows.append(cells)
    return header, rows


def _col(header: list[str], *names: str) -> int | None:
    lowered = [h.lower() for h in header]
    for name in names:
        if name.lower() in lowered:
            return lowered.index(name.lower())
    return None


def _enabled(cell: str) -> bool | None:
    value = cell.strip().lower()
    if value in ("yes", "true", "1"):
        return True
    if value in ("no", "false", "0"):
        return False
    return None


def parse_list_sets(text: str) -> list[dict[str, Any]]:
    """Parse ``ncu --list-sets``.

    Args:
        text: its output: a fixed-width table of Identifier, Sections, Enabled and
            Estimated Metrics whose Sections cell wraps over several lines.

    Returns:
        ``[{"identifier", "sections": [...], "enabled": bool|None,
        "estimated_metrics": int|None}]`` in the order printed; ``[]`` when the text
        holds no table.
    """
    header, rows = _table_rows(text)
    i_id = _col(header, "Identifier")
    i_sec = _col(header, "Sections")
    i_en = _col(header, "Enabled")
    i_est = _col(header, "Estimated Metrics")
    out: list[dict[str, Any]] = []
    if i_id is None:
        return out
    for row in rows:
        ident = row[i_id].strip()
        if not ident:
            continue
        sections: list[str] = []
        if i_sec is not None:
            # Names hold no blanks, so blanks left by wrapping are dropped.
            sections = ["".join(s.split()) for s in row[i_sec].split(",")]
            sections = [s for s in sections if s]
        est: int | None = None
        if i_est is not None:
            digits = re.sub(r"[^\d]", "", row[i_est])
            est = int(digits) if digits else None
        out.append({
            "identifier": ident,
            "sections": sections,
            "enabled": _enabled(row[i_en]) if i_en is not None else None,
            "estimated_metrics": est,
        })
    return out


def parse_list_sections(text: str) -> list[dict[str, Any]]:
    """Parse ``ncu --list-sections``.

    Args:
        text: its output: Identifier, Display Name, Enabled and Filename columns (the
            file name is shortened on the left with ``...``).

    Returns:
        ``[{"identifier", "display_name", "enabled": bool|None, "filename"}]``.
    """
    header, rows = _table_rows(text)
    i_id = _col(header, "Identifier")
    i_name = _col(header, "Display Name")
    i_en = _col(header, "Enabled")
    i_file = _col(header, "Filename")
    out: list[dict[str, Any]] = []
    if i_id is None:
        return out
    for row in rows:
        ident = "".join(row[i_id].split())
        if not ident:
            continue
        out.append({
            "identifier": ident,
            "display_name": " ".join(row[i_name].split()) if i_name is not None else "",
            "enabled": _enabled(row[i_en]) if i_en is not None else None,
            "filename": row[i_file].strip() if i_file is not None else "",
        })
    return out


def validate_selection(ncu_set: str | None, sections: Iterable[str] | None,
                       available_sets: Iterable[str], available_sections: Iterable[str]
                       ) -> list[str]:
    """Problems with a requested ``--set``/``--section`` choice, one sentence each.

    ncu itself refuses an unknown section (``did not match any section``) but quietly
    collects nothing for an unknown set, so both are checked before a run.

    Args:
        ncu_set: the requested set, or None.
        sections: requested section identifiers (``regex:…`` entries are not checked).
        available_sets: identifiers from :func:`parse_list_sets`.
        available_sections: identifiers from :func:`parse_list_sections`.

    Returns:
        An empty list when the choice is valid.
    """
    sets = list(available_sets)
    known = list(available_sections)
    problems: list[str] = []
    if ncu_set and sets and ncu_set not in sets:
        hint = " (the old set name 'default' is now 'basic')" if ncu_set == "default" else ""
        problems.append(f"unknown ncu set {ncu_set!r}{hint}; this ncu has: {', '.join(sets)}")
    lowered = {s.lower(): s for s in known}
    for section in sections or []:
        if section.startswith("regex:") or not known or section in known:
            continue
        close = lowered.get(section.lower())
        hint = f" (did you mean {close!r}?)" if close else ""
        problems.append(f"unknown ncu section {section!r}{hint}; see ncu --list-sections")
    return problems
