"""The wire protocol between the laptop and the pod agent.

Every message is one JSON object on one line (NDJSON), tagged by its ``type`` field.
The laptop encodes requests and decodes events with the msgspec Structs below; the
agent (standard library only) writes the same JSON shapes by hand, and a contract
test checks that every event the agent can emit decodes strictly here.

Schema evolution: add fields with defaults only. Never rename or retype a field.

Envelope: every event carries ``run_id``/``seq`` (set for run events, which are
durable on the pod and replayable) and ``ts`` (unix seconds), plus ``req`` when it
answers a request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

PROTOCOL_VERSION = 1
#: Longest line either side accepts. Ncu metric events for one kernel are a few KB; a
#: Tier-1 sample batch is at most a few thousand floats. 8 MiB leaves room for a
#: probe on a 8-GPU box and refuses runaway garbage.
MAX_LINE = 8 * 1024 * 1024


class Msg(msgspec.Struct, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    """Base of every message; ``type`` is the tag."""


# ----------------------------------------------------------------------------- requests
class Request(Msg, kw_only=True):
    """A laptop → agent request; ``req`` is echoed on every answer."""

    req: int


class Ping(Request, kw_only=True, tag="ping"):
    pass


class ProbeReq(Request, kw_only=True, tag="probe"):
    pass


class RunSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What to run and how; stored verbatim with the run.

    ``workload`` is ``builtin:NAME[?k=v&...]``, ``file:NAME`` (the file was sent to the
    pod beforehand, ``file_b64`` carries it) or ``cmd:COMMAND``.
    """

    workload: str
    tiers: list[int] = msgspec.field(default_factory=lambda: [1, 2, 3])
    # Tier 1
    target_ci: float = 0.01
    max_seconds: float = 10.0
    min_samples: int = 10
    warmup: int = 5
    # auto: cold for calls >= 10 µs, hot in batches below. None only in specs stored
    # before this field existed; they said ``cold`` (default hot) instead.
    timing: Literal["auto", "cold", "hot"] | None = None
    cold: bool = False
    # Tier 3
    kernel_regex: str | None = None
    launch_skip: int = 0
    launch_count: int = 1
    ncu_set: str | None = None
    ncu_sections: list[str] | None = None
    replay_mode: str | None = None
    clock_control: str = "none"
    cache_control: str = "all"
    ncu_path: str | None = None
    #: The rank whose process Tier 3 profiles where the workload starts several (None:
    #: rank 0 where Tier 2 saw ranks).
    rank: int | None = None
    # file: workloads carry their source so the run dir is self-contained.
    file_name: str | None = None
    file_b64: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_s: float | None = None
    #: Install the CuPy wheel that fits the driver when the pod lacks CuPy.
    install_cupy: bool = False
    #: Launches of the workload per profiled process (Tier 2 and Tier 3).
    profile_iters: int = 10
    #: The GPU to run on, as the person typed it: an index (``"1"``) or a UUID
    #: (``"GPU-…"``). None: whatever CUDA picks first. The agent resolves it to one GPU
    #: and pins every tier to it (``CUDA_VISIBLE_DEVICES`` for the workload, ncu's
    #: ``--devices`` to match); :attr:`RunStarted.gpu` says which it was.
    gpu: str | None = None
    #: The synced workspace the run executes in (its name on the pod, as
    #: :class:`WorkspaceApply` gave it): a ``cmd:`` runs with it as the working
    #: directory, a ``file:PATH`` is that path inside it, with the workspace's root on
    #: ``sys.path``. None: the run directory, as before workspaces existed.
    workspace: str | None = None
    #: Tier 3's time budget: a plan estimated to take longer (:class:`Tier3Estimate`) is
    #: stopped before ncu starts, with a cheaper plan named. None: no budget.
    max_tier3_s: float | None = None
    #: One of the connection's held loop (``gpuws watch``): the Tier-1 child is forked
    #: from a parent that imported CuPy, torch and Triton once (never CUDA) and lives as
    #: long as the connection, and the pod is probed once for all such runs: seconds less
    #: per iteration. False: a fresh interpreter per child, a fresh probe per run.
    fork_server: bool = False

    def timing_mode(self) -> str:
        """Tier 1's mode: ``timing``, or what a spec stored before it meant."""
        if self.timing is not None:
            return self.timing
        return "cold" if self.cold else "hot"


class StartRun(Request, kw_only=True, tag="start_run"):
    spec: RunSpec
    run_id: str | None = None


class Attach(Request, kw_only=True, tag="attach"):
    run_id: str
    from_seq: int = 0
    follow: bool = True


class Cancel(Request, kw_only=True, tag="cancel"):
    run_id: str


class ListRuns(Request, kw_only=True, tag="list_runs"):
    pass


class TelemetryReq(Request, kw_only=True, tag="telemetry"):
    """Start (``interval_s`` > 0) or stop (0) periodic Telemetry events."""

    interval_s: float = 1.0


class NcuPlanReq(Request, kw_only=True, tag="ncu_plan"):
    """Ask which ncu fits the pod; with ``install`` run the plan and verify it."""

    install: bool = False


class NsysPlanReq(Request, kw_only=True, tag="nsys_plan"):
    """Ask which nsys the pod has, or how to install one; with ``install`` run the plan
    (only after the person confirmed it) and verify it with a smoke profile."""

    install: bool = False


class StatFile(Request, kw_only=True, tag="stat_file"):
    """Size and sha256 of a file under the agent's run directories."""

    path: str


class Shutdown(Request, kw_only=True, tag="shutdown"):
    pass


# -- workspaces (gpuws/workspace/ on the laptop, remote_agent/workspace.py on the pod)
class WsEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One file of a workspace manifest; a JSON array on the wire (a 5,000-file manifest
    is ~30% shorter than as objects). ``mode`` is 0o755 or 0o644: only the executable bit
    travels."""

    path: str
    mode: int
    sha256: str
    size: int


class WsPiece(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """``length`` bytes of blob ``sha256`` (``size`` bytes in all) from ``offset``: a put's
    data is its pieces back to back. A blob larger than one put travels in several."""

    sha256: str
    size: int
    offset: int
    length: int


class WorkspacePut(Request, kw_only=True, tag="workspace_put"):
    """Blobs for the pod's content store: ``data`` is the pieces' bytes, concatenated,
    zlib-compressed when ``zlib``, base64-encoded (a line of text on every transport)."""

    pieces: list[WsPiece]
    data: str
    zlib: bool = False


class WorkspaceApply(Request, kw_only=True, tag="workspace_apply"):
    """Make the pod's workspace ``name`` exactly this tree (paths it held before and this
    manifest lacks are removed). Answered with :class:`WorkspaceState`: ``missing`` lists
    the hashes the content store lacks, and nothing is changed until it is empty."""

    name: str
    entries: list[WsEntry]
    tree_sha256: str


class LeaseReq(Request, kw_only=True, tag="lease"):
    """The pod's lease (remote_agent/lease.py): arm it with ``idle_s`` and the pod's own
    ``stop_argv``, ``release`` it, or (neither) ask how it stands. Answered with
    :class:`LeaseStatus`."""

    idle_s: float | None = None
    stop_argv: list[str] | None = None
    stop_running: bool = False
    release: bool = False


Requests = (
    Ping | ProbeReq | StartRun | Attach | Cancel | ListRuns | TelemetryReq | NcuPlanReq
    | NsysPlanReq | StatFile | Shutdown | WorkspacePut | WorkspaceApply | LeaseReq
)


# ----------------------------------------------------------------------------- events
class Event(Msg, kw_only=True):
    """An agent → laptop message. Run events have ``run_id`` and a gap-free ``seq``."""

    run_id: str | None = None
    seq: int | None = None
    ts: float = 0.0
    req: int | None = None


class Hello(Event, kw_only=True, tag="hello"):
    agent_version: str
    agent_sha256: str
    protocol_version: int
    python: str = ""
    pid: int = 0


class Pong(Event, kw_only=True, tag="pong"):
    pass


class Error(Event, kw_only=True, tag="error"):
    """A failure with a cause and a remedy (``code`` is stable and machine-readable)."""

    code: str
    title: str
    message: str
    remedy: str = ""


class Log(Event, kw_only=True, tag="log"):
    level: Literal["debug", "info", "warning", "error"] = "info"
    message: str


# -- probe
class GpuProcess(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A process holding a GPU context (NVML's compute/graphics process lists)."""

    pid: int
    name: str = ""
    used_mib: float | None = None


class Gpu(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    index: int
    name: str
    uuid: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    compute_capability: str | None = None
    pci_bus_id: str | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    #: Active clock-event (throttle) reasons by name (``sw_power_cap``, ``hw_slowdown``,
    #: ``sw_thermal``, …; ``gpu_idle`` is one too); empty when none or not readable.
    clock_events: list[str] = msgspec.field(default_factory=list)
    #: Who uses the GPU now (other than the agent); None when it could not be read.
    processes: list[GpuProcess] | None = None
    #: Whether NVML GPM answered for the agent's user (asked with one real sample);
    #: None: not asked (no NVML, or an agent before this field).
    gpm_supported: bool | None = None
    #: Why GPM did not answer (one line), when it did not.
    gpm_reason: str = ""


class ToolInstall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    version: str | None = None
    error: str | None = None


class Counters(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rm_profiling_admin_only: bool | None = None
    cap_sys_admin: bool | None = None
    cap_perfmon: bool | None = None
    uid: int | None = None
    #: The agent's prediction: ``allowed``, ``blocked`` or ``unknown``.
    verdict: str = "unknown"
    reason: str = ""


class PyPackage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    version: str | None = None
    cuda: str | None = None
    error: str | None = None


class PythonCandidate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One interpreter the agent looked at when choosing the workloads' Python."""

    path: str
    version: str | None = None
    #: Packages found there, each as ``name version`` (torch, cupy).
    packages: list[str] = msgspec.field(default_factory=list)
    error: str | None = None


class PythonChoice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which Python runs the workloads on the pod, and why."""

    path: str
    version: str | None = None
    #: ``--python``, ``login`` (the login PATH's python3 has what is needed), ``found``
    #: (another interpreter had it), or ``fallback`` (none had it: the login python3).
    how: str
    reason: str
    candidates: list[PythonCandidate] = msgspec.field(default_factory=list)


#: A machine id or boot id as systemd and the kernel write them (hex, the boot id dashed).
HostId = Annotated[str, msgspec.Meta(pattern=r"\A[0-9a-f-]{1,64}\Z")]


class Probe(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything the agent learns about the pod without a GPU context."""

    hostname: str
    os: str
    kernel: str
    arch: str
    container: list[str]
    virtualization: list[str]
    python_path: str
    python_version: str
    uid: int
    user: str
    home: str
    cpu_count: int | None = None
    memory_total_mib: float | None = None
    gpus: list[Gpu] = msgspec.field(default_factory=list)
    gpu_source: str | None = None
    gpu_error: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    toolkits: list[ToolInstall] = msgspec.field(default_factory=list)
    python_packages: list[PyPackage] = msgspec.field(default_factory=list)
    ncu: list[ToolInstall] = msgspec.field(default_factory=list)
    nsys: list[ToolInstall] = msgspec.field(default_factory=list)
    counters: Counters = msgspec.field(default_factory=Counters)
    probe_s: float = 0.0
    #: The interpreter workloads run under (None from agents before this field).
    python_choice: PythonChoice | None = None
    #: The pod's ``/etc/machine-id`` and kernel boot id (lowercase hex and dashes, at most
    #: 64): equal to the laptop's, the "pod" is the laptop itself (an alias for 127.0.0.1),
    #: and ``[defaults]`` may not arm a stop there. None: unreadable, or an older agent.
    machine_id: HostId | None = None
    boot_id: HostId | None = None


class ProbeResult(Event, kw_only=True, tag="probe_result"):
    probe: Probe


# -- ncu selection
class NcuChoice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    version: str | None
    compatible: bool
    reason: str


class NcuPlan(Event, kw_only=True, tag="ncu_plan"):
    driver: str | None
    cuda_driver: str | None
    arch: str | None
    choices: list[NcuChoice]
    selected: str | None
    selected_version: str | None
    reason: str
    install_plan: list[list[str]] | None = None
    install_target_version: str | None = None
    installed: bool = False
    verified: str | None = None


class StatResult(Event, kw_only=True, tag="stat_result"):
    path: str
    size: int
    sha256: str


# -- runs
class RunInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    run_id: str
    workload: str
    status: str
    started: float
    last_seq: int
    pid: int | None = None


class RunList(Event, kw_only=True, tag="run_list"):
    runs: list[RunInfo]


class GpuTarget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The GPU a run was pinned to, resolved by the agent from :attr:`RunSpec.gpu`."""

    index: int
    uuid: str | None = None
    name: str = ""
    #: Other processes on that GPU when the run started (a busy GPU skews every figure).
    busy: list[GpuProcess] = msgspec.field(default_factory=list)
    #: Its SM count (the CUDA driver's, from the probe), which tells a grid too small to
    #: fill it; None where not known (no driver answer, an agent before this field).
    sm_count: int | None = None


class RunStarted(Event, kw_only=True, tag="run_started"):
    spec: RunSpec
    run_dir: str
    pid: int
    hostname: str = ""
    gpu: GpuTarget | None = None


class Tier3Estimate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What Tier 3 should take, said before ncu starts (``remote_agent/measure/tier3_cost``).

    ``seconds`` = ``start_s`` + ``launches`` × ``passes`` × (``kernel_s`` +
    ``pass_overhead_s``) + ``read_s``. Each ``*_basis`` says where its figure came from
    (measured here, by an earlier tier, or in gpuws's recorded runs). Dollars are the
    laptop's: ``seconds`` at the session's rate.
    """

    seconds: float
    passes: int
    passes_basis: str = ""
    launches: int = 1
    launches_basis: str = ""
    kernel_s: float | None = None
    kernel_basis: str = ""
    pass_overhead_s: float = 0.0
    start_s: float = 0.0
    start_basis: str = ""
    read_s: float = 0.0
    #: ``--max-tier3-seconds`` when one was given.
    budget_s: float | None = None
    #: Cheaper plans, each one line (fewer sections, one launch, a narrower filter).
    cheaper: list[str] = msgspec.field(default_factory=list)


class TierStarted(Event, kw_only=True, tag="tier_started"):
    tier: int
    name: str
    argv: list[str] | None = None
    #: Tier 3 only: the time it should take, before ncu starts.
    estimate: Tier3Estimate | None = None


class GpmMetrics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """NVML GPM's device-wide averages over a window (``remote_agent/pod/gpm.py``).

    Percentages 0-100 of the whole GPU between two samples bracketing the window (Tier 1's
    timed rounds, or a ``cmd:`` workload's run): another process on the GPU counts too,
    and idle time inside the window lowers them. A metric NVML did not give is None; when
    GPM gave nothing, ``reason`` says why in one line. This struct is also the GPM
    evidence a kernel verdict takes (``window_s`` None means no figures).
    """

    window_s: float | None = None
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    hmma_active_pct: float | None = None
    dram_bw_pct: float | None = None
    fp64_pct: float | None = None
    fp32_pct: float | None = None
    fp16_pct: float | None = None
    #: Tier 1 only: the share of the window its timed calls took (Σ CUDA-event samples /
    #: ``window_s``); the rest is L2 flushes, idle holds and launch gaps, which GPM's
    #: averages include (a cold Tier 1 idles 1 ms before each sample).
    timed_share_pct: float | None = None
    reason: str = ""
    source: str = "NVML GPM"


class TierFinished(Event, kw_only=True, tag="tier_finished"):
    tier: int
    status: Literal["ok", "failed", "skipped", "fallback"]
    wall_s: float
    gpu_s: float | None = None
    source: str | None = None
    reason: str = ""
    #: NVML GPM over the tier's window (Tier 1's timed rounds, a ``cmd:``'s run as tier 0);
    #: None: not sampled (an agent before this field, or another tier).
    gpm: GpmMetrics | None = None


class Output(Event, kw_only=True, tag="output"):
    stream: Literal["stdout", "stderr"]
    text: str
    tier: int | None = None
    #: The next Output of the same stream continues this line (a long line is cut in
    #: pieces of at most 16 KiB on the pod, on a character boundary).
    cont: bool = False


class Samples(Event, kw_only=True, tag="samples"):
    """A batch of Tier-1 samples, each the time of one call in milliseconds."""

    values_ms: list[float]
    batch: int = 1
    #: None: CUDA-event samples. "cupti": a short call timed again from CUPTI activity
    #: records, whose figure the run reports; these replace the event samples wherever a
    #: run's samples are read (its histogram, compare, watch), so a comparison is made on
    #: the same samples as the figure it sits beside.
    source: Literal["cupti"] | None = None


class TimingStats(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    n: int
    median_ms: float
    mean_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float
    p5_ms: float
    p95_ms: float
    ci_low_ms: float
    ci_high_ms: float
    ci_rel_halfwidth: float


class ClockRange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The clocks, power and temperature of the GPU while Tier 1 sampled (NVML)."""

    samples: int
    sm_mhz_min: float | None = None
    sm_mhz_median: float | None = None
    sm_mhz_max: float | None = None
    #: The GPU's highest SM clock (its boost ceiling), for cycle-space comparisons.
    sm_mhz_ceiling: float | None = None
    mem_mhz_min: float | None = None
    mem_mhz_max: float | None = None
    power_w_max: float | None = None
    power_limit_w: float | None = None
    temp_c_max: float | None = None
    #: Every clock-event reason seen while sampling, by name (``gpu_idle`` excluded).
    clock_events: list[str] = msgspec.field(default_factory=list)
    source: str = "nvml"


class Tier1Result(Event, kw_only=True, tag="tier1_result"):
    stats: TimingStats
    mode: Literal["cold", "hot"]
    batch: int
    warmup: int
    stop_reason: str
    bytes: float | None = None
    flops: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    peak_gbps: float | None = None
    peak_tflops: float | None = None
    pct_peak_bw: float | None = None
    pct_peak_flops: float | None = None
    peak_source: str | None = None
    l2_flush_bytes: int | None = None
    # What was asked (auto/cold/hot; ``mode`` is what ran), how L2 was flushed (read or
    # memset) and how long the GPU idled before each cold sample.
    requested_mode: str | None = None
    l2_flush_method: str | None = None
    cold_gap_ms: float | None = None
    #: The clocks behind the figure (None: not readable, or an agent before this field).
    clocks: ClockRange | None = None
    #: An event pair's own cost (ms), measured around nothing under the samples'
    #: conditions and taken out of every sample before it was sent (None: an agent before
    #: this field, whose samples still hold it).
    timer_ms: float | None = None
    #: What the figure was timed with: "CUDA events" or "CUPTI (torch.profiler)" (short
    #: calls, timed again from activity records; None: an agent before this field).
    timing_source: str | None = None
    #: The CUDA-event median (ms) a CUPTI figure replaced (None: events are the figure).
    events_median_ms: float | None = None
    #: One line on a short call's figure: from CUPTI, how far ncu's own range reads above
    #: it; from events (no CUPTI records), the event pair's floor above the device time.
    caution: str | None = None


class KernelRow(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    calls: int
    total_ns: float
    mean_ns: float
    share_pct: float
    #: The code that launched this kernel most (``modeling_llama.py:123 in forward``: the
    #: innermost Python frame outside torch and the interpreter), where the profile had
    #: Python stacks.
    code: str | None = None
    #: The launch configuration that took most of this kernel's time (``(8, 1, 1)`` and
    #: ``(128, 1, 1)``, as ncu writes Grid Size and Block Size): the instance Tier 3
    #: profiles, where the profile recorded it.
    grid: str | None = None
    block: str | None = None
    #: This kernel's launches before the first of that configuration, from the profile's
    #: start: the ``--launch-skip`` that brings ncu to it.
    launch_skip: int | None = None


class Phase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A one-time part of the run left out of the steady window, with its time."""

    phase: str
    ns: float
    #: The longest code frames in it, with their times ("" where none).
    what: str = ""


class SteadyWindow(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The repeated part of a run that the kernel table and its shares describe."""

    #: ``steps``, ``decode steps``, ``'train' steps``.
    label: str
    #: ``ProfilerStep``, ``record_function`` or ``kernel repeats``.
    basis: str
    first_step: int
    last_step: int
    steps: int
    step_ns: float | None = None
    kernels_per_step: float | None = None
    left_out: list[Phase] = msgspec.field(default_factory=list)


class HostSite(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A place in the code and what the host did there (launches, syncs, time)."""

    code: str
    count: float | None = None
    ns: float | None = None


class HostTime(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The launching thread's time over the steady window, split by what the trace shows:
    PyTorch ops (dispatch and launch), waits for the GPU, data loading, other Python."""

    wall_ns: float
    launches: int = 0
    launch_ns: float = 0.0
    op_ns: float = 0.0
    dispatch_ns: float = 0.0
    sync_ns: float = 0.0
    sync_calls: int = 0
    data_ns: float = 0.0
    #: In torch.distributed's collectives (a host backend such as gloo blocks there).
    comm_ns: float = 0.0
    python_ns: float = 0.0
    #: The deepest code frame every launch of the window ran under (the loop).
    loop: str | None = None
    launch_sites: list[HostSite] = msgspec.field(default_factory=list)
    sync_sites: list[HostSite] = msgspec.field(default_factory=list)
    python_sites: list[HostSite] = msgspec.field(default_factory=list)


class CommShare(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Collective communication over the window, and its part no compute kernel overlaps."""

    #: ``kernels`` (NCCL's on the GPU) or ``host`` (gloo, MPI: the host's collectives).
    where: str
    comm_ns: float
    exposed_ns: float
    comm_pct: float | None = None
    exposed_pct: float | None = None


class RankTable(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One process's kernel table (a rank of ``torchrun``, ``mpirun``…)."""

    rank: int | None = None
    pid: int | None = None
    kernels: list[KernelRow] = msgspec.field(default_factory=list)
    gpu_idle_pct: float | None = None
    span_ns: float | None = None
    window: SteadyWindow | None = None
    host: HostTime | None = None
    comm: CommShare | None = None


class KernelTable(Event, kw_only=True, tag="kernel_table"):
    source: str
    kernels: list[KernelRow]
    gpu_idle_pct: float | None = None
    memcpy_pct: float | None = None
    #: The kernel span the shares are of, the idle gaps inside it and the longest one
    #: (None where the timeline did not give them, or from agents before these fields).
    span_ns: float | None = None
    gap_count: int | None = None
    largest_gap_ns: float | None = None
    #: The host's waits for the GPU (cudaStreamSynchronize, cudaDeviceSynchronize, …) that
    #: end inside the span, and the host time blocked in them (None: the trace had no host
    #: API calls, or an agent before these fields).
    sync_count: int | None = None
    sync_ns: float | None = None
    #: The steady window the kernels and shares describe (None: the whole run).
    window: SteadyWindow | None = None
    #: Where the host's time went over the window (None: no host activity traced).
    host: HostTime | None = None
    #: Collective communication over the window (None: none seen).
    comm: CommShare | None = None
    #: One table per process where several ran (ranks); the rows above merge them.
    ranks: list[RankTable] | None = None


class NcuProgress(Event, kw_only=True, tag="ncu_progress"):
    kernel: str
    percent: int
    passes: int | None = None
    done: bool = False


class Stall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reason: str
    pct: float


class KernelMetrics(Event, kw_only=True, tag="kernel_metrics"):
    """Canonical metrics of one profiled kernel launch; unknown values are ``None``."""

    kernel: str
    launch: int
    metrics: dict[str, float | None]
    stalls: list[Stall] = msgspec.field(default_factory=list)
    source: str = "ncu_report"
    block: str | None = None
    grid: str | None = None


class Rule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kernel: str
    rule: str
    kind: str
    message: str
    est_speedup_pct: float | None = None
    speedup_type: str | None = None


class RuleFindings(Event, kw_only=True, tag="rule_findings"):
    rules: list[Rule]


class StaticAnalysis(Event, kw_only=True, tag="static_analysis"):
    kernel: str
    registers_per_thread: int | None
    shared_mem_per_block: int | None
    local_mem_per_thread: int | None
    block_size: int | None
    theoretical_occupancy_pct: float | None
    limiter: str | None
    source: str


class Diagnosis(Event, kw_only=True, tag="diagnosis"):
    """Something the person must know: a cause, what it means, and what to do."""

    code: str
    severity: Literal["info", "warning", "error"]
    title: str
    cause: str
    meaning: str = ""
    remedies: list[str] = msgspec.field(default_factory=list)
    unmeasured: list[str] = msgspec.field(default_factory=list)
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class Artifact(Event, kw_only=True, tag="artifact"):
    name: str
    path: str
    size: int
    sha256: str
    kind: str = "file"


class NsysPlan(Event, kw_only=True, tag="nsys_plan"):
    """Which nsys the pod has, or how one would be installed (nothing runs unasked)."""

    installs: list[ToolInstall]
    selected: str | None = None
    selected_version: str | None = None
    reason: str = ""
    install_plan: list[list[str]] | None = None
    install_how: str = ""
    install_target: str | None = None
    installed: bool = False
    verified: str | None = None


# -- verdicts (remote_agent/verdicts: pure functions, run on the pod and again on the laptop)
class Evidence(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One number behind a verdict and the tool that measured it (``ncu``, ``CUDA
    events``, ``torch.profiler``, ``nsys``, ``NVML GPM``, ``static analysis``)."""

    name: str
    value: float | None = None
    unit: str = ""
    source: str = ""


class Finding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One finding of a program verdict: a title, why, and what to try."""

    code: str
    severity: Literal["info", "warning", "error"] = "info"
    title: str
    detail: str = ""
    remedies: list[str] = msgspec.field(default_factory=list)
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    #: The kernel the finding is about (full name), where it is about one.
    kernel: str | None = None


class FamilyShare(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Kernel time of one family (GEMM, attention, normalisation, elementwise, reduction,
    copy/memset, communication, other)."""

    family: str
    share_pct: float
    kernels: int = 0
    calls: int = 0
    total_ns: float = 0.0


class ProgramVerdict(Event, kw_only=True, tag="program_verdict"):
    """What bounds the program, from Tier 2's kernel table; findings in order, first the
    one that decides what to do next."""

    source: str
    #: ``gpu``, ``launch``, ``transfer`` or ``host`` (host work or synchronisation).
    bound: str
    summary: str
    gpu_busy_pct: float | None = None
    memcpy_pct: float | None = None
    launches: int = 0
    kernels: int = 0
    mean_kernel_ns: float | None = None
    families: list[FamilyShare] = msgspec.field(default_factory=list)
    findings: list[Finding] = msgspec.field(default_factory=list)
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    top_kernel: str | None = None
    top_share_pct: float | None = None
    #: Whether Tier 3's target is worth profiling, given this verdict ("" without Tier 3).
    tier3_advice: str = ""
    #: The window judged ("decode steps 2-23, 8.1 ms each") and what was left out of it
    #: ("" where the whole run was judged).
    window: str = ""
    left_out: str = ""


class RankedRule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An ncu rule finding that suggests a change, with the figure that speaks for it."""

    rule: str
    kind: str
    message: str
    est_speedup_pct: float | None = None
    speedup_type: str | None = None
    evidence: str = ""


class KernelVerdict(Event, kw_only=True, tag="kernel_verdict"):
    """What bounds one kernel, in one sentence, with its evidence and ncu's ranked rules."""

    kernel: str
    short_name: str = ""
    launch: int | None = None
    #: ``dram``, ``cache`` (L1/L2/shared), ``compute_tensor``, ``compute_sm``,
    #: ``latency``, ``occupancy``, ``small_grid`` or ``unknown``.
    bound: str
    sentence: str
    #: Whether hardware counters (ncu) stand behind it; False: Tier 1, GPM, static.
    counters: bool = True
    sources: list[str] = msgspec.field(default_factory=list)
    evidence: list[Evidence] = msgspec.field(default_factory=list)
    rules: list[RankedRule] = msgspec.field(default_factory=list)


class CoverageRow(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    short_name: str = ""
    share_pct: float = 0.0
    #: Why Tier 3 missed it ("" for a kernel it profiled).
    why: str = ""


class Tier3Coverage(Event, kw_only=True, tag="tier3_coverage"):
    """Tier 3 checked against Tier 2: which of the top kernels ncu profiled, which not."""

    regex: str | None = None
    launch_skip: int = 0
    launch_count: int = 1
    profiled: list[CoverageRow] = msgspec.field(default_factory=list)
    missed: list[CoverageRow] = msgspec.field(default_factory=list)
    #: Kernels ncu profiled that are not among Tier 2's top ones.
    others: list[str] = msgspec.field(default_factory=list)


class RunFinished(Event, kw_only=True, tag="run_finished"):
    status: Literal["ok", "failed", "cancelled"]
    wall_s: float
    exit_code: int | None = None
    error: str | None = None


class GpuSample(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    index: int
    util_pct: float | None = None
    mem_used_mib: float | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    mem_clock_mhz: float | None = None
    clock_events: list[str] = msgspec.field(default_factory=list)


class Telemetry(Event, kw_only=True, tag="telemetry"):
    gpus: list[GpuSample]


class WorkspaceStored(Event, kw_only=True, tag="workspace_stored"):
    """A put's answer: blobs completed and verified, and pieces refused (a piece that does
    not follow the part already held, or a blob whose bytes do not match its hash)."""

    stored: int
    refused: list[str] = msgspec.field(default_factory=list)


class WorkspaceState(Event, kw_only=True, tag="workspace_state"):
    """An apply's answer: the hashes still missing (nothing was changed), or the tree made."""

    name: str
    missing: list[str] = msgspec.field(default_factory=list)
    applied: bool = False
    root: str = ""
    written: int = 0
    removed: int = 0


class LeaseStop(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A stop the pod's lease logged: when it ran ``stop_on_pod`` (``at``), after how long
    with nobody there, and whether the command said it worked (None: the log ends there,
    as when the pod went down under it); ``ended_at`` when the command returned."""

    at: float
    idle_for_s: float
    ok: bool | None = None
    ended_at: float | None = None


class LeaseStatus(Event, kw_only=True, tag="lease_status"):
    """How the pod's lease stands: armed (its process alive) with ``idle_s``; when nobody
    holds the pod, the wall time it stops at (``deadline_ts``); else who holds it.

    ``stops``: the last stops its log holds (at most :data:`MAX_LEASE_STOPS`), so a laptop
    learns of a stop it did not see. ``now_ts`` is the pod's clock when this was written:
    the laptop reads every time here against it, not against its own clock.
    ``left_out``: set by the laptop, whatever the pod sent: how many of the pod's stops and
    times it left out (out of range, or in the pod's future), so that one bad entry costs
    that entry, not the whole status.
    """

    armed: bool = False
    idle_s: float | None = None
    deadline_ts: float | None = None
    connections: int = 0
    runs: int = 0
    last_event: str | None = None
    reason: str | None = None
    now_ts: float | None = None
    stops: list[LeaseStop] = msgspec.field(default_factory=list)
    left_out: int = 0


#: How many of its stops a lease reports (the pod keeps them all in its log).
MAX_LEASE_STOPS = 8


Events = (
    LeaseStatus | Hello | Pong | Error | Log | ProbeResult | NcuPlan | NsysPlan | StatResult
    | RunList
    | RunStarted | TierStarted | TierFinished | Output | Samples | Tier1Result | KernelTable
    | NcuProgress | KernelMetrics | RuleFindings | StaticAnalysis | Diagnosis | Artifact
    | RunFinished | Telemetry | WorkspaceStored | WorkspaceState | ProgramVerdict
    | KernelVerdict | Tier3Coverage
)

#: Event types that belong to a run's durable log (written to events.ndjson on the pod).
RUN_EVENT_TYPES = frozenset(
    {
        "run_started", "tier_started", "tier_finished", "output", "samples",
        "tier1_result", "kernel_table", "ncu_progress", "kernel_metrics",
        "rule_findings", "static_analysis", "diagnosis", "artifact", "run_finished",
        "log", "program_verdict", "kernel_verdict", "tier3_coverage",
    }
)


class BadLine(msgspec.Struct, frozen=True):
    """A line that could not be decoded; reported, never fatal."""

    reason: str
    preview: str
    length: int


_event_decoder: msgspec.json.Decoder[Events] = msgspec.json.Decoder(Events)
_encoder = msgspec.json.Encoder()


def encode(msg: Msg) -> bytes:
    """Encode one message as a line (with its trailing newline)."""
    return _encoder.encode(msg) + b"\n"


def decode_event(line: bytes) -> Events | BadLine:
    """Decode one line into an event, or describe why it is not one."""
    if len(line) > MAX_LINE:
        return BadLine(f"line of {len(line)} bytes exceeds the {MAX_LINE}-byte limit",
                       _preview(line), len(line))
    try:
        return _event_decoder.decode(line)
    except msgspec.DecodeError as exc:
        return BadLine(str(exc), _preview(line), len(line))
    except (UnicodeDecodeError, RecursionError) as exc:
        # msgspec raises these, not DecodeError, for invalid UTF-8 inside a string and for
        # a value nested thousands deep; uncaught, either would end the session.
        reason = ("nested too deeply to decode" if isinstance(exc, RecursionError)
                  else f"not valid UTF-8: {exc}")
        return BadLine(reason, _preview(line), len(line))


def _preview(line: bytes, limit: int = 120) -> str:
    text = line[:limit].decode("utf-8", "replace")
    return text + ("…" if len(line) > limit else "")


def to_builtins(msg: msgspec.Struct) -> Any:
    """The JSON-ready form of a message (dicts, lists, scalars)."""
    return msgspec.to_builtins(msg)
