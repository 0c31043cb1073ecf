"""One process's torch.profiler trace read for the program verdict: its steady state, where
its host time goes, which code launched each kernel, and its communication.

A Chrome trace of ``torch.profiler`` with CPU and CUDA activity and ``with_stack=True``
(kineto's format) holds, per process:

- device activity: ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events, each with
  ``args.correlation``, the id of the host call that launched it;
- host API calls: ``cuda_runtime`` / ``cuda_driver`` events (``cudaLaunchKernel``,
  ``cudaStreamSynchronize``…) with the same ``args.correlation``;
- operators: ``cpu_op`` events (``aten::mm``), nested by time on their thread;
- Python frames: ``python_function`` events named ``path/file.py(123): function``,
  nested by time on their thread (the call stack of every op and launch);
- annotations: ``user_annotation`` events (``ProfilerStep#3``, ``record_function``).

:func:`analyse` reads them once and returns the steady window (the repeated part of the
run: profiler steps where the program marks them, else the repeats of its kernel
sequence), the kernel rows of that window each with the code that launched it most, the
window's timeline figures, the host's time in it split by evidence (dispatch, syncs, data
loading, other Python), and the communication share and its part not overlapped with
compute.

Standard library only (runs on the pod's python3 >= 3.8).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .tier2_parse import SYNC_CALL, rank_kernels, sync_stats, timeline_stats

#: Host API calls that launch device work (runtime and driver; CUDA graphs launch many).
LAUNCH_CALL = re.compile(r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch)")
#: A blocking copy to the host waits for the GPU like a sync (``.item()`` on older torch).
BLOCKING_COPY = re.compile(r"^(cudaMemcpy|cuMemcpyDtoH)(_v\d+)?$")
#: Collective kernels (NCCL names them ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL`` or
#: ``ncclKernel_…``; RCCL the same).
COMM_KERNEL = re.compile(r"^(void )?(nccl|rccl)", re.I)
#: Host-side collectives, where the backend works on the host (gloo, MPI): c10d's ops and
#: the backends' record_function names.
COMM_HOST = re.compile(r"^(c10d::(allreduce|allgather|reduce_scatter|broadcast|alltoall|"
                       r"reduce|barrier|send|recv|_allgather|_reduce_scatter)|"
                       r"(gloo|mpi|nccl|ucc):)", re.I)
#: ``file.py(123): function`` (kineto's name for a Python frame).
FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
#: Frames that are not the program's code: torch itself, the interpreter's library, the
#: C functions Python calls. A kernel is tied to the innermost frame that is none of
#: these: the user's script or the model's code (``modeling_llama.py``).
_INTERNAL_PATH = re.compile(
    r"(^|/)(torch|torch_[a-z]+|triton|_pytest|pluggy|runpy|threading|contextlib|functools|"
    r"importlib|typing|abc|enum|site|sitecustomize|copy|weakref|warnings|"
    r"collections|dataclasses|inspect)(/|\.py$)|/lib/python\d\.\d+/[^/]+\.py$"
    r"|^<|^\?")
#: Frames that only wrap another (decorators, nn.Module's call machinery): a phase is
#: named after what they wrap.
_WRAPPER = re.compile(r": (wrapper|inner|_call_impl|_wrapped_call_impl|decorate_context|"
                      r"<module>|main|_run_code|_run_module_code|run_path|__exit__|__enter__)$")
#: torch.distributed's collectives called from Python (a host backend such as gloo
#: blocks in them).
COMM_FRAME = re.compile(r"torch/distributed/distributed_c10d\.py\(\d+\): (all_reduce|"
                        r"all_gather|all_gather_into_tensor|reduce_scatter|"
                        r"reduce_scatter_tensor|broadcast|reduce|all_to_all|"
                        r"all_to_all_single|barrier|send|recv|gather|scatter)$")
#: Frames of data loading (torch's DataLoader, a Dataset's __getitem__).
DATA_FRAME = re.compile(r"torch/utils/data/|(^|[^a-z])(dataloader|dataset)\.py", re.I)
#: The steps of a generation loop are decode steps (each one new token).
DECODE_FRAME = re.compile(r"(^|_)(generate|sample|greedy_search|beam_search|decode)", re.I)
#: Annotations torch itself writes (``aten::``, ``nccl:all_reduce``, ``## Call ... ##``,
#: ``Optimizer.step#SGD.step``): not the program marking its steps.
_TORCH_ANNOTATION = re.compile(r"::|:|^##|#|^Optimizer|^DistributedDataParallel|"
                               r"^cuda|^enumerate\(DataLoader\)")
#: A kernel sequence repeats where one segment signature covers most kernels; anchors
#: tried (rarest repeated kernels first) and the fewest repeats that make a steady state.
MAX_ANCHORS = 200
MAX_ANCHOR_WORK = 20_000_000
MIN_STEPS = 3
#: Most rows kept per kernel table (the wire's bound; the rest is in the shares).
MAX_ROWS = 200
#: Python functions and sync sites listed as evidence.
TOP_SITES = 5
#: What a kernel row says of the instance Tier 3 profiles (``protocol.KernelRow``).
INSTANCE_KEYS = ("grid", "block", "launch_skip")


def frame_label(name: str) -> str:
    """``modeling_llama.py:123 in forward`` from kineto's ``…/modeling_llama.py(123):
    forward``; the name itself when it is not a file frame."""
    m = FRAME.match(name)
    if m is None:
        return name[:200]
    path, line, func = m.groups()
    return "%s:%s in %s" % (path.rsplit("/", 1)[-1][:120], line, func[:80])


def is_code(name: str) -> bool:
    """Whether a Python frame is the program's (or its model's) code, not torch's or the
    interpreter's."""
    m = FRAME.match(name)
    if m is None:
        return False
    path = m.group(1).replace("\\", "/")
    return _INTERNAL_PATH.search(path) is None


class _Kernel:
    __slots__ = ("code", "config", "corr", "device", "end", "launch_ts", "name", "start")

    def __init__(self, name: str, start: int, end: int, device: int, corr: Optional[int],
                 config: Optional[Tuple[str, str]] = None) -> None:
        self.name = name
        self.start = start
        self.end = end
        self.device = device
        self.corr = corr
        self.launch_ts: Optional[int] = None
        self.code: Optional[str] = None
        #: (grid, block) as ncu writes them, ``("(8, 1, 1)", "(128, 1, 1)")``.
        self.config = config


def dims(value: Any) -> Optional[str]:
    """kineto's ``args.grid``/``args.block`` (``[8, 1, 1]``) as ncu writes a launch's Grid
    Size and Block Size (``(8, 1, 1)``); None for anything else."""
    if not isinstance(value, list) or len(value) != 3:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 32
               for v in value):
        return None  # CUDA's limits: 2^31-1 blocks in x, 65535 in y and z, 1024 threads
    return "(%d, %d, %d)" % tuple(value)


def _ns(value: Any) -> int:
    return round(float(value) * 1000.0)


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def analyse(trace: Mapping[str, Any]) -> Dict[str, Any]:
    """The steady window, host evidence, code of each kernel and communication of one
    process's trace (see the module docstring).

    Returns:
        ``{"kernels": rows of the window (``code`` on each where the stack gave it),
        timeline figures of the window (as :func:`timeline_stats` plus ``sync_count``,
        ``sync_ns``), "window": dict or None, "host": dict or None, "comm": dict or None,
        "rank": int or None}``. Without a window, the figures are the whole run's.
    """
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    if not isinstance(events, list):
        return {"kernels": [], "window": None, "host": None, "comm": None, "rank": None}
    kernels: List[_Kernel] = []
    copies: List[Tuple[int, int, int, str]] = []
    runtime: List[Tuple[int, int, Any, str, Optional[int]]] = []  # start, end, tid, name, corr
    ops: List[Tuple[int, int, Any, str]] = []
    frames: List[Tuple[int, int, Any, str]] = []
    notes: List[Tuple[int, int, Any, str]] = []
    t_first: Optional[int] = None
    t_last: Optional[int] = None
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            start = _ns(ev["ts"])
            end = start + _ns(ev.get("dur") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        assert isinstance(args, dict)
        if cat in ("cpu_op", "python_function", "user_annotation", "cuda_runtime",
                   "cuda_driver"):
            t_first = start if t_first is None else min(t_first, start)
            t_last = end if t_last is None else max(t_last, end)
        if cat == "kernel":
            if end > start:
                device = _int(args.get("device", ev.get("pid"))) or 0
                grid, block = dims(args.get("grid")), dims(args.get("block"))
                kernels.append(_Kernel(name, start, end, device, _int(args.get("correlation")),
                                       None if grid is None or block is None
                                       else (grid, block)))
        elif cat in ("gpu_memcpy", "memcpy", "gpu_memset", "memset"):
            if end > start:
                copies.append((_int(args.get("device", ev.get("pid"))) or 0, start, end,
                               "memcpy" if "memcpy" in cat else "memset"))
        elif cat in ("cuda_runtime", "cuda_driver"):
            runtime.append((start, end, (ev.get("pid"), ev.get("tid")), name,
                            _int(args.get("correlation"))))
        elif cat == "cpu_op":
            ops.append((start, end, (ev.get("pid"), ev.get("tid")), name))
            if name.startswith("ProfilerStep#"):
                notes.append((start, end, (ev.get("pid"), ev.get("tid")), name))
        elif cat == "python_function":
            frames.append((start, end, (ev.get("pid"), ev.get("tid")), name))
        elif cat == "user_annotation":
            notes.append((start, end, (ev.get("pid"), ev.get("tid")), name))
    rank = _rank_of(trace)
    if not kernels:
        return {"kernels": [], "window": None, "host": None, "comm": None, "rank": rank}
    launches = {corr: (start, tid) for start, _e, tid, name, corr in runtime
                if corr is not None and LAUNCH_CALL.match(name)}
    for k in kernels:
        got = launches.get(k.corr) if k.corr is not None else None
        if got is not None:
            k.launch_ts = got[0]
    kernels.sort(key=lambda k: (k.launch_ts if k.launch_ts is not None else k.start, k.start))
    stacks = _Stacks(frames, ops, runtime)
    code_of = stacks.launch_code
    for k in kernels:
        k.code = code_of.get(k.corr) if k.corr is not None else None
    window = _annotated_steps(notes, kernels) or _repeated_steps(kernels)
    if window is None:
        lo_i, hi_i = 0, len(kernels)
    else:
        lo_i, hi_i = window.pop("_range")
    chosen = kernels[lo_i:hi_i]
    lo = min(k.start for k in chosen)
    hi = (kernels[hi_i].start if hi_i < len(kernels) and kernels[hi_i].start > lo
          else max(k.end for k in chosen))
    spans: Dict[int, Tuple[int, int]] = {}
    for k in chosen:
        a, b = spans.get(k.device, (k.start, k.end))
        spans[k.device] = (min(a, k.start), max(b, k.end))
    if window is not None and hi_i < len(kernels) and kernels[hi_i].device in spans:
        # A step runs to the next one's first kernel: its trailing wait is the step's.
        d = kernels[hi_i].device
        spans[d] = (spans[d][0], max(spans[d][1], kernels[hi_i].start))
    figures = _timeline(chosen, copies, runtime, spans)
    host_lo = chosen[0].launch_ts
    host_hi = (kernels[hi_i].launch_ts if hi_i < len(kernels) else chosen[-1].launch_ts)
    host = None
    if host_lo is not None and host_hi is not None and host_hi > host_lo and runtime:
        host = stacks.host_time(host_lo, host_hi, [k.corr for k in chosen])
    if window is not None:
        window["left_out"] = _left_out(kernels, lo_i, hi_i, lo, hi, t_first, t_last,
                                       stacks, host_lo)
        owner = host.get("loop") if host else None
        if window["basis"] == "kernel repeats" and owner and DECODE_FRAME.search(
                owner.rsplit(" in ", 1)[-1]):
            window["label"] = "decode steps"
    comm = _comm(chosen, ops + [(a, b, t, n) for a, b, t, n in notes], lo, hi)
    # bounds_ns: the judged span in the trace's own clock, for the merged timeline
    # trace (timeline_trace), which marks it; the kernel table never carries it.
    return {"kernels": _rows(chosen, kernels), **figures, "window": window, "host": host,
            "comm": comm, "rank": rank, "bounds_ns": (lo, hi) if window is not None else None}


def _rank_of(trace: Mapping[str, Any]) -> Optional[int]:
    info = trace.get("distributedInfo")
    if isinstance(info, dict):
        return _int(info.get("rank"))
    return None


def _rows(kernels: List[_Kernel], every: List[_Kernel]) -> List[Dict[str, Any]]:
    """Ranked rows of ``kernels`` (the window), each with the code that launched it most
    and its instance (:func:`_instances`; ``every`` is the whole trace in launch order)."""
    acc: Dict[str, List[Any]] = {}
    for k in kernels:
        entry = acc.setdefault(k.name, [0, 0, Counter(), Counter()])
        entry[0] += 1
        entry[1] += k.end - k.start
        if k.code:
            entry[2][k.code] += 1
        if k.config is not None:
            entry[3][k.config] += k.end - k.start
    rows = rank_kernels({"name": n, "calls": c, "total_ns": float(t)}
                        for n, (c, t, _codes, _configs) in acc.items())
    rows = rows[:MAX_ROWS]
    chosen: Dict[str, Tuple[str, str]] = {}
    for row in rows:
        codes, configs = acc[row["name"]][2], acc[row["name"]][3]
        if codes:
            row["code"] = codes.most_common(1)[0][0]
        if configs:
            # Counter keeps first-seen order, so a tie goes to the configuration seen first.
            chosen[row["name"]] = max(configs.items(), key=lambda kv: kv[1])[0]
    skips = _instances(every, chosen)
    for row in rows:
        if row["name"] in skips:  # every window launch is in the trace: always, for one
            row["grid"], row["block"] = chosen[row["name"]]
            row["launch_skip"] = skips[row["name"]]
    return rows


def _instances(every: List[_Kernel], chosen: Mapping[str, Tuple[str, str]]) -> Dict[str, int]:
    """For each kernel name, its launches before the first one of the chosen launch
    configuration, counting from the trace's first launch: what ncu's ``--launch-skip``
    (which counts only launches its ``-k`` filter matched) must skip to profile that
    instance, where the trace began where ncu's count begins."""
    seen: Dict[str, int] = {}
    skips: Dict[str, int] = {}
    for k in every:
        want = chosen.get(k.name)
        if want is None or k.name in skips:
            continue
        if k.config == want:
            skips[k.name] = seen.get(k.name, 0)
        else:
            seen[k.name] = seen.get(k.name, 0) + 1
    return skips


def _timeline(chosen: List[_Kernel], copies: List[Tuple[int, int, int, str]],
              runtime: List[Tuple[int, int, Any, str, Optional[int]]],
              spans: Dict[int, Tuple[int, int]]) -> Dict[str, Any]:
    """:func:`timeline_stats` over each device's span (the window's, or the run's)."""
    intervals = sorted([(k.device, k.start, k.end, "kernel") for k in chosen]
                       + [c for c in copies if c[0] in spans and c[2] > spans[c[0]][0]
                          and c[1] < spans[c[0]][1]])
    stats = timeline_stats(spans, intervals)
    syncs = ([(a, b) for a, b, _t, name, _c in runtime if SYNC_CALL.match(name)]
             if runtime else None)
    return {**stats, **sync_stats(spans, syncs)}


# ------------------------------------------------------------------ steady window
def _annotated_steps(notes: List[Tuple[int, int, Any, str]], kernels: List[_Kernel]
                     ) -> Optional[Dict[str, Any]]:
    """Steps the program marks: ``ProfilerStep#N``, else one ``record_function`` name
    repeated at least ``MIN_STEPS`` times (the one whose repeats launch the most)."""
    groups: Dict[str, List[Tuple[int, int]]] = {}
    for start, end, _tid, name in notes:
        if name.startswith("ProfilerStep#"):
            groups.setdefault("ProfilerStep#", []).append((start, end))
        elif not _TORCH_ANNOTATION.search(name):
            groups.setdefault(name, []).append((start, end))
    launched = [k.launch_ts for k in kernels]
    if any(t is None for t in launched):
        return None
    best: Optional[Tuple[int, str, List[Tuple[int, int]]]] = None
    for name, spans in groups.items():
        spans = sorted(set(spans))
        if len(spans) < MIN_STEPS:
            continue
        covered = sum(_count_in(launched, a, b) for a, b in spans)
        if best is None or covered > best[0] or (name == "ProfilerStep#" and covered >= best[0]):
            best = (covered, name, spans)
    if best is None or best[0] == 0:
        return None
    _covered, name, spans = best
    # Each step: the kernels launched inside it (index ranges into the launch order).
    ranges = []
    for a, b in spans:
        i = _bisect(launched, a)
        j = _bisect(launched, b + 1)
        if j > i:
            ranges.append((i, j))
    if len(ranges) < MIN_STEPS:
        return None
    first = 1 if len(ranges) > MIN_STEPS else 0  # the first step warms up
    label = "steps" if name == "ProfilerStep#" else "'%s' steps" % name[:60]
    return _window(kernels, ranges, first, len(ranges), label,
                   "ProfilerStep" if name == "ProfilerStep#" else "record_function")


def _bisect(values: List[Any], x: int) -> int:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _count_in(values: List[Any], a: int, b: int) -> int:
    return _bisect(values, b + 1) - _bisect(values, a)


def _repeated_steps(kernels: List[_Kernel]) -> Optional[Dict[str, Any]]:
    """The repeated period of the kernel sequence, where the program marks none.

    Each kernel name that recurs is tried as the start of a step (rarest first); the
    sequence cut at its occurrences gives segments, and the segment signature (the
    sequence of kernel names) repeated most covers the repeated part. The longest
    segment among the anchors that cover nearly as much wins (a step, not a layer). The
    window is the last run of consecutive repeats, without its first (warm-up) step.
    """
    names: Dict[str, int] = {}
    seq = [names.setdefault(k.name, len(names)) for k in kernels]
    counts = Counter(seq)
    candidates = sorted((c, n) for n, c in counts.items() if MIN_STEPS <= c <= len(seq) // 2)
    # Each anchor costs a pass over the sequence: fewer for a long one (a training run's
    # million kernels), so the agent's reading stays in seconds.
    anchors = max(8, min(MAX_ANCHORS, MAX_ANCHOR_WORK // max(1, len(seq))))
    tried = []
    for _c, anchor in candidates[:anchors]:
        cuts = [i for i, n in enumerate(seq) if n == anchor] + [len(seq)]
        sigs = [hash(tuple(seq[a:b])) for a, b in zip(cuts, cuts[1:])]
        if not sigs:
            continue
        top, m = Counter(sigs).most_common(1)[0]
        if m < MIN_STEPS:
            continue
        matches = [s == top for s in sigs]
        length = next(b - a for (a, b), ok in zip(zip(cuts, cuts[1:]), matches) if ok)
        tried.append((m * length, length, cuts, matches))
    if not tried:
        return None
    most = max(t[0] for t in tried)
    _covered, _length, cuts, matches = max((t for t in tried if t[0] >= 0.9 * most),
                                         key=lambda t: (t[1], t[0]))
    # The last run of consecutive matching segments.
    end = max(i for i, ok in enumerate(matches) if ok) + 1
    start = end
    while start > 0 and matches[start - 1]:
        start -= 1
    if end - start < MIN_STEPS:
        return None
    ranges = [(cuts[i], cuts[i + 1]) for i in range(start, end)]
    # The sequence's end closes the last segment (``cuts`` ends with it).
    first = 1 if len(ranges) > MIN_STEPS else 0
    return _window(kernels, ranges, first, len(ranges), "steps", "kernel repeats")


def _window(kernels: List[_Kernel], ranges: List[Tuple[int, int]], first: int, count: int,
            label: str, basis: str) -> Dict[str, Any]:
    """The window of steps ``ranges[first:count]`` (numbered from 1 in ``ranges``)."""
    lo_i, hi_i = ranges[first][0], ranges[count - 1][1]
    starts = [kernels[a].start for a, _b in ranges[first:count]]
    after = kernels[hi_i].start if hi_i < len(kernels) else max(
        k.end for k in kernels[ranges[count - 1][0]:hi_i])
    steps = count - first
    return {"label": label, "basis": basis, "first_step": first + 1, "last_step": count,
            "steps": steps, "step_ns": float(after - starts[0]) / steps if steps else None,
            "kernels_per_step": float(hi_i - lo_i) / steps if steps else None,
            "_range": (lo_i, hi_i)}


def _left_out(kernels: List[_Kernel], lo_i: int, hi_i: int, lo: int, hi: int,
              t_first: Optional[int], t_last: Optional[int], stacks: "_Stacks",
              host_lo: Optional[int]) -> List[Dict[str, Any]]:
    """The one-time phases outside the window, each with its time and what it holds."""
    out: List[Dict[str, Any]] = []
    begin = min(t_first if t_first is not None else kernels[0].start, kernels[0].start)
    first_kernel = kernels[0].start
    if first_kernel - begin > 0:
        out.append({"phase": "before the first kernel", "ns": float(first_kernel - begin),
                    "what": stacks.longest_before(first_kernel)})
    if lo_i > 0:
        out.append({"phase": "first kernels before the window (%d kernels)" % lo_i,
                    "ns": float(lo - first_kernel),
                    "what": stacks.longest_between(kernels[0].launch_ts, host_lo)})
    end = max(t_last if t_last is not None else 0, max(k.end for k in kernels))
    if end > hi:
        after = len(kernels) - hi_i
        out.append({"phase": "after the window" + (" (%d kernels)" % after if after else ""),
                    "ns": float(end - hi), "what": ""})
    return out


# ------------------------------------------------------------------ host stacks
class _Stacks:
    """The Python frames and operators of each host thread, for launches and host time."""

    def __init__(self, frames: List[Tuple[int, int, Any, str]],
                 ops: List[Tuple[int, int, Any, str]],
                 runtime: List[Tuple[int, int, Any, str, Optional[int]]]) -> None:
        self.frames = sorted(frames, key=lambda f: (f[0], -f[1]))
        self.ops = ops
        self.runtime = runtime
        self.launch_code: Dict[int, str] = {}
        #: Per launch correlation: the ids of the code frames it was called under.
        self._chains: Dict[int, Tuple[int, ...]] = {}
        self._labels: List[str] = []
        self._sweep()

    def _sweep(self) -> None:
        by_tid: Dict[Any, List[Tuple[int, int, int, Any]]] = {}
        for i, (start, end, tid, _name) in enumerate(self.frames):
            by_tid.setdefault(tid, []).append((start, 0, end, i))
        for start, end, tid, name, corr in self.runtime:
            if corr is not None and (LAUNCH_CALL.match(name) or SYNC_CALL.match(name)
                                     or BLOCKING_COPY.match(name)):
                by_tid.setdefault(tid, []).append((start, 1, end, corr))
        for items in by_tid.values():
            items.sort(key=lambda x: (x[0], x[1], -x[2]))
            stack: List[Tuple[int, Tuple[int, ...]]] = []  # (end, code chain)
            for start, kind, end, ref in items:
                while stack and stack[-1][0] <= start:
                    stack.pop()
                chain = stack[-1][1] if stack else ()
                if kind == 0:
                    name = self.frames[ref][3]
                    if is_code(name):
                        self._labels.append(frame_label(name))
                        chain = (*chain, len(self._labels) - 1)
                    stack.append((end, chain))
                elif chain:
                    self.launch_code[ref] = self._labels[chain[-1]]
                    self._chains[ref] = chain

    def host_time(self, lo: int, hi: int, corrs: List[Optional[int]]) -> Dict[str, Any]:
        """The host's time from ``lo`` to ``hi`` on the launching thread, split by
        evidence (see ``protocol.HostTime``)."""
        mine = {c for c in corrs if c is not None}
        launches = [(a, b, tid, n, c) for a, b, tid, n, c in self.runtime
                    if lo <= a < hi and LAUNCH_CALL.match(n)]
        tids = Counter(tid for _a, _b, tid, _n, _c in launches)
        tid = tids.most_common(1)[0][0] if tids else None
        wall = hi - lo
        launch_ns = sum(b - a for a, b, t, _n, _c in launches if t == tid)
        n_launch = sum(1 for launch in launches if launch[2] == tid)
        syncs = [(a, b, c, n) for a, b, t, n, c in self.runtime
                 if t == tid and lo <= a < hi and (SYNC_CALL.match(n) or BLOCKING_COPY.match(n))]
        sync_ns = sum(b - a for a, b, _c, _n in syncs)
        sync_sites: Counter[str] = Counter()
        sync_calls: Counter[str] = Counter()
        for a, b, c, _n in syncs:
            site = self.launch_code.get(c, "?") if c is not None else "?"
            sync_sites[site] += b - a
            sync_calls[site] += 1
        # Top-level operators on the thread: PyTorch's dispatch of each op, its launches
        # and (for .item()) its syncs.
        op_ns = 0
        cur_end = -1
        for a, b, _t, _n in sorted(o for o in self.ops if o[2] == tid and lo <= o[0] < hi):
            if a >= cur_end:
                op_ns += min(b, hi) - a
                cur_end = b
        # Python frames: self time per code frame (children frames and ops taken out),
        # data loading, and the deepest code frame common to all launches (the loop).
        data_ns = 0
        self_ns: Counter[str] = Counter()
        fr = [f for f in self.frames if f[2] == tid and f[1] > lo and f[0] < hi]
        data_end = -1
        comm_ns = 0
        comm_end = -1
        for a, b, _t, name in fr:
            if a >= data_end and DATA_FRAME.search(name.split("(", 1)[0]):
                data_ns += min(b, hi) - max(a, lo)
                data_end = b
            if a >= comm_end and COMM_FRAME.search(name):
                comm_ns += min(b, hi) - max(a, lo)
                comm_end = b
        for label, ns in _self_times(fr, [o for o in self.ops if o[2] == tid], lo, hi):
            self_ns[label] += ns
        loop: Optional[Tuple[int, ...]] = None
        for c in mine:
            chain = self._chains.get(c)
            if chain is None:
                continue
            if loop is None:
                loop = chain
            else:
                n = 0
                while n < len(loop) and n < len(chain) and loop[n] == chain[n]:
                    n += 1
                loop = loop[:n]
        sites = Counter(self.launch_code[c] for c in mine if c in self.launch_code)
        dispatch_ns = max(0, op_ns - sync_ns)
        return {
            "wall_ns": float(wall), "launches": n_launch, "launch_ns": float(launch_ns),
            "op_ns": float(op_ns), "dispatch_ns": float(dispatch_ns),
            "sync_ns": float(sync_ns), "sync_calls": len(syncs),
            "data_ns": float(data_ns), "comm_ns": float(comm_ns),
            "python_ns": float(max(0, wall - dispatch_ns - sync_ns - data_ns - comm_ns)),
            "loop": self._labels[loop[-1]] if loop else None,
            "launch_sites": [{"code": s, "count": float(n)} for s, n in
                             sites.most_common(TOP_SITES)],
            "sync_sites": [{"code": s, "count": float(sync_calls[s]), "ns": float(ns)}
                           for s, ns in sync_sites.most_common(TOP_SITES)],
            "python_sites": [{"code": s, "ns": float(ns)}
                             for s, ns in self_ns.most_common(TOP_SITES) if ns > 0],
        }

    def longest_before(self, t: int) -> str:
        return self._outer(None, t)

    def longest_between(self, a: Optional[int], b: Optional[int]) -> str:
        return self._outer(a, b)

    def _outer(self, a: Optional[int], b: Optional[int]) -> str:
        """The longest code frames that lie wholly between ``a`` and ``b``, as text."""
        if b is None:
            return ""
        picked: List[Tuple[int, str]] = []
        taken_end = -1
        for start, end, _tid, name in self.frames:
            if (a is not None and start < a) or end > b or start < taken_end:
                continue
            if end - start >= 1_000_000 and not _WRAPPER.search(name):
                picked.append((end - start, name))
                taken_end = end
        picked.sort(reverse=True)
        return ", ".join("%s %.0f ms" % (frame_label(n), ns / 1e6) for ns, n in picked[:3])


def _self_times(frames: List[Tuple[int, int, Any, str]], ops: List[Tuple[int, int, Any, str]],
                lo: int, hi: int) -> List[Tuple[str, int]]:
    """Each frame's own time inside [lo, hi) (minus child frames and top-level ops),
    given to the nearest code frame (torch's module-call machinery counts for the model
    code that called it)."""
    items: List[Tuple[int, int, int, str]] = [(a, 0, b, n) for a, b, _t, n in frames]
    items += [(a, 1, b, "") for a, b, _t, _n in ops if b > lo and a < hi]
    items.sort(key=lambda x: (x[0], x[1], -x[2]))
    out: List[Tuple[str, int]] = []
    # stack entries: [end, start, label of nearest code frame, child time, in window]
    stack: List[List[Any]] = []

    def close(entry: List[Any]) -> None:
        a, b = max(entry[1], lo), min(entry[0], hi)
        own = max(0, (b - a) - entry[3])
        if entry[2] is not None and own > 0:
            out.append((entry[2], own))

    op_end = -1
    for start, kind, end, name in items:
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        if kind == 1:
            if start >= op_end and stack:
                stack[-1][3] += min(end, hi) - max(start, lo)
            op_end = max(op_end, end)
            continue
        if stack:
            stack[-1][3] += max(0, min(end, hi) - max(start, lo))
        # A collective's wait is communication, not its caller's Python: nobody's.
        label = None if COMM_FRAME.search(name) else frame_label(name) if is_code(name) \
            else (stack[-1][2] if stack else None)
        stack.append([end, start, label, 0])
    while stack:
        close(stack.pop())
    return out


# ------------------------------------------------------------------ communication
def _comm(chosen: List[_Kernel], host_ops: List[Tuple[int, int, Any, str]], lo: int, hi: int
          ) -> Optional[Dict[str, Any]]:
    """Collective time in the window and its part not overlapped by compute kernels.

    With collective kernels (NCCL) those are the communication; else the host-side
    collectives (gloo, MPI) are, the GPU then waiting for the host."""
    comm = [(k.start, k.end) for k in chosen if COMM_KERNEL.match(k.name)]
    where = "kernels"
    if not comm:
        comm = sorted({(max(a, lo), min(b, hi)) for a, b, _t, n in host_ops
                       if COMM_HOST.match(n) and b > lo and a < hi})
        where = "host"
    if not comm:
        return None
    compute = sorted((k.start, k.end) for k in chosen if not COMM_KERNEL.match(k.name))
    comm_union = _union(sorted(comm))
    exposed = _minus(comm_union, _union(compute))
    span = hi - lo
    comm_ns = sum(b - a for a, b in comm_union)
    exposed_ns = sum(b - a for a, b in exposed)
    return {"where": where, "comm_ns": float(comm_ns), "exposed_ns": float(exposed_ns),
            "comm_pct": 100.0 * comm_ns / span if span > 0 else None,
            "exposed_pct": 100.0 * exposed_ns / span if span > 0 else None}


def _union(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(spans: List[Tuple[int, int]], cover: List[Tuple[int, int]]
           ) -> List[Tuple[int, int]]:
    """Parts of ``spans`` (sorted, disjoint) outside ``cover`` (sorted, disjoint)."""
    out: List[Tuple[int, int]] = []
    j = 0
    for a, b in spans:
        while j < len(cover) and cover[j][1] <= a:
            j += 1
        k = j
        cur = a
        while k < len(cover) and cover[k][0] < b:
            if cover[k][0] > cur:
                out.append((cur, cover[k][0]))
            cur = max(cur, cover[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out
