"""The structured results of the tools, as typed dicts: each tool's output schema is
derived from these (``tests/mcp/tool_schemas.json`` pins them).

``typing_extensions.TypedDict``: pydantic, which builds the schemas, refuses
``typing.TypedDict`` before Python 3.12.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict


class HostEntry(TypedDict):
    host: str
    agent: bool
    agent_may_start_stop: bool
    rate_usd_per_hour: float | None
    has_start: bool
    has_stop: bool


class HostsOut(TypedDict):
    hosts: list[HostEntry]
    budget_usd: float | None
    spent_usd: float
    device_s: float
    max_run_seconds: float


class Tier1Out(TypedDict):
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    n: int
    mode: str
    stop_reason: str
    gbps: float | None
    tflops: float | None


class Provenance(TypedDict):
    run_id: str
    host: str
    hostname: str | None
    gpu_name: str | None
    gpu_uuid: str | None
    gpu_index: int | None
    driver: str | None
    clocks: dict[str, Any] | None
    timing_mode: str | None
    tree_sha256: str | None
    git_commit: str | None
    git_dirty: bool | None
    gpuws_version: str | None


class RunOut(TypedDict):
    run_id: str
    session_id: str
    workload: str
    status: str
    why: str
    wall_s: float | None
    exit_code: int | None
    tiers: list[dict[str, Any]]
    tier1: Tier1Out | None
    verdicts: list[dict[str, Any]]
    kernels: list[dict[str, Any]]
    diagnoses: list[dict[str, Any]]
    code: dict[str, Any] | None
    output_tail: list[str]
    provenance: Provenance


class CompareOut(TypedDict):
    run_a: str
    run_b: str
    median_a_ms: float
    median_b_ms: float
    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    verdict: str
    change: str
    cliffs_delta: float
    n_a: int
    n_b: int
    differences: list[str]
    code_changes: list[str] | None
    provenance_a: Provenance
    provenance_b: Provenance


class ActionOut(TypedDict):
    at: float
    tool: str
    arguments: dict[str, Any]
    outcome: str
    detail: str
    host: str | None
    run_id: str | None
    cost_usd: float | None


class HistoryRun(TypedDict):
    run_id: str
    session_id: str
    host: str
    workload: str
    status: str
    started: float | None
    tier1_median_ms: float | None
    tier1_ci_pct: float | None
    by: str


class HistoryOut(TypedDict):
    runs: list[HistoryRun]
    agent_actions: list[ActionOut]


class ExportOut(TypedDict):
    session_id: str
    markdown: str


class SyncOut(TypedDict):
    host: str
    name: str
    root: str
    files: int
    tree_sha256: str
    git_commit: str | None
    git_dirty: bool | None
    blobs_sent: int
    bytes_sent: int
    seconds: float


class PowerOut(TypedDict):
    host: str
    action: str
    answers: bool
    detail: str
