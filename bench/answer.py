"""Time to an answer on a GPU: a whole ``gpuws run`` beside the same steps typed by hand.

For ``builtin:saxpy``, a ``file:`` workload (bench/workloads/softmax.py) and a ``cmd:``
Python script running a small transformer forward (bench/workloads/transformer.py), in
the same run:

- **gpuws**: the whole ``gpuws run local -w WORKLOAD --json`` process (Tiers 1+2+3 through
  the local pod: agent start, probe, the tiers, the artifact pull), and each tier's own
  wall time from its ``tier_finished`` event;
- **by hand**, each as its own process, as a person would type them:
  Tier 1 — ``triton.testing.do_bench`` of the workload (Python workloads), or the script
  alone (``cmd:``, gpuws's Tier 0); Tier 2 — one ``ncu --metrics gpu__time_duration.sum``
  pass over every kernel (``nsys profile`` + ``nsys stats`` instead where a working nsys
  exists); Tier 3 — ncu's default sections on one launch of the top kernel (the
  ncu pass's top kernel for the script). The nsys inside an Nsight Compute install
  writes no report: it is reported as absent.

Reported: each step's wall time (median over ``--repeats``), the whole run ÷ the by-hand
sum (goal ≤ 1.2×), the transformer's Tier 2 (goal ≤ 10 s) and whole run (goal ≤ 15 s).
A failing or hanging step is recorded with its error and the bench goes on. Needs an
NVIDIA GPU, ncu, CuPy, torch and triton::

    PYTHONPATH=src python3 bench/answer.py --out answer.json
    PYTHONPATH=src python3 bench/answer.py --dry-run        # the commands, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
CASES = ("saxpy", "file", "transformer")
#: Goals of issue 13 (whole run ÷ by-hand sum; the transformer's Tier 2 and whole run).
GOAL_RATIO = 1.2
GOAL_TFM_TIER2_S = 10.0
GOAL_TFM_WHOLE_S = 15.0
#: Calls of the workload per profiled process, as gpuws's --profile-iters default.
PROFILE_ITERS = 10
#: What a person runs under ncu or nsys for a Python workload: set up, then the calls
#: between cudaProfilerStart/Stop (as gpuws's ``child exec`` does).
TARGET = (
    "import sys, cupy\n"
    "from gpuws.kernels.registry import make_builtin, parse_workload\n"
    "from gpuws.kernels.workload import load_file_workload\n"
    "ref = parse_workload(sys.argv[1])\n"
    "w = load_file_workload(ref.target) if ref.kind == 'file' else "
    "make_builtin(ref.target, ref.params)\n"
    "w.setup(); cupy.cuda.runtime.deviceSynchronize()\n"
    "cupy.cuda.runtime.profilerStart()\n"
    "for _ in range(int(sys.argv[2])): w.run()\n"
    "cupy.cuda.runtime.deviceSynchronize(); cupy.cuda.runtime.profilerStop()\n")
#: Tier 1 by hand: triton's do_bench with its defaults, printing the median in ms.
DO_BENCH = (
    "import sys, cupy\n"
    "from triton.testing import do_bench\n"
    "from gpuws.kernels.registry import make_builtin, parse_workload\n"
    "from gpuws.kernels.workload import load_file_workload\n"
    "ref = parse_workload(sys.argv[1])\n"
    "w = load_file_workload(ref.target) if ref.kind == 'file' else "
    "make_builtin(ref.target, ref.params)\n"
    "w.setup(); cupy.cuda.runtime.deviceSynchronize()\n"
    "print('do_bench median ms', do_bench(w.run))\n")
GPUWS = "import sys; from gpuws.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Case:
    """One workload: how gpuws is given it, and what a person runs by hand."""

    key: str
    workload: str
    kind: str  # "python" (builtin:/file:) or "cmd"
    target: list[str]  # the program a profiler starts by hand
    regex: str | None  # Tier 3's kernel (None: the by-hand ncu pass's top kernel)


def cases(python: str, which: list[str]) -> list[Case]:
    """The workloads asked for, with their by-hand programs."""
    softmax, tfm = WORKLOADS / "softmax.py", WORKLOADS / "transformer.py"
    every = {
        "saxpy": Case("saxpy", "builtin:saxpy", "python",
                      [python, "-c", TARGET, "builtin:saxpy", str(PROFILE_ITERS)], "saxpy"),
        "file": Case("file", f"file:{softmax}", "python",
                     [python, "-c", TARGET, f"file:{softmax}", str(PROFILE_ITERS)],
                     "softmax_rows"),
        "transformer": Case("transformer", f"cmd:{python} {tfm}", "cmd", [python, str(tfm)],
                            None),
    }
    return [every[k] for k in which]


# ---------------------------------------------------------------------- running steps
def run_step(name: str, argv: list[str], timeout: float, *, env: dict[str, str] | None = None,
             cwd: str | None = None, dry: bool = False) -> dict[str, Any]:
    """One process, timed whole; a failure or a timeout is recorded, never raised.

    The process gets its own process group, killed whole on a timeout (ncu leaves its
    target running otherwise).
    """
    step: dict[str, Any] = {"name": name, "argv": argv, "ok": False, "rc": None,
                            "wall_s": None, "error": None, "stdout": "", "stderr_tail": ""}
    if dry:
        step["error"] = "dry run"
        return step
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                                cwd=cwd, start_new_session=True)
    except OSError as exc:
        step["error"] = f"cannot start {argv[0]}: {exc}"
        return step
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        step["error"] = f"timed out after {timeout:g} s"
    step["wall_s"] = time.perf_counter() - t0
    step["rc"] = proc.returncode
    step["stdout"], step["stderr_tail"] = out, err[-2000:]
    if step["error"] is None and proc.returncode != 0:
        last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        step["error"] = f"exit {proc.returncode}: {last[:300]}"
    step["ok"] = step["error"] is None
    return step


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def gpuws_run(case: Case, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The whole ``gpuws run local`` process, and each tier's wall time from its events."""
    argv = [sys.executable, "-c", GPUWS, "run", "local", "-w", case.workload, "--json",
            "--python", args.python]
    if args.max_seconds is not None:
        argv += ["--max-seconds", str(args.max_seconds)]
    t0 = time.time()
    step = run_step("gpuws run", argv, args.timeout, env=env, dry=args.dry_run)
    events = []
    for line in step.pop("stdout").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    step.update(read_events(events, t0, step))
    step["events"] = len(events)
    run_id = next((ev.get("run_id") for ev in events if ev.get("type") == "run_started"), None)
    if run_id and step["error"] and step["error"].startswith("timed out"):
        # The run is a detached worker on the pod: stop it, or it runs on under the
        # next measurements.
        run_step("gpuws cancel", [sys.executable, "-c", GPUWS, "cancel", "local", str(run_id),
                                  "--python", args.python], 60, env=env)
    return step


def read_events(events: list[dict[str, Any]], t0: float, step: dict[str, Any]
                ) -> dict[str, Any]:
    """What a ``gpuws run --json`` printed: each tier's wall time and path, the kernel
    table's source and top kernel, the run's end (a failed run marks ``step`` failed)."""
    out: dict[str, Any] = {}
    tiers: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for ev in events:
        if ev.get("type") == "tier_started":
            names[str(ev["tier"])] = str(ev.get("name"))
        elif ev.get("type") == "tier_finished":
            tiers[str(ev["tier"])] = {"wall_s": ev.get("wall_s"), "status": ev.get("status"),
                                      "source": ev.get("source"), "reason": ev.get("reason"),
                                      "answer_at_s": ev.get("ts", t0) - t0}
        elif ev.get("type") == "kernel_table":
            out["kernel_table_source"] = ev.get("source")
            out["top_kernel"] = (ev.get("kernels") or [{}])[0].get("name")
        elif ev.get("type") == "run_finished":
            out["run_status"] = ev.get("status")
            out["run_wall_s"] = ev.get("wall_s")
            if ev.get("status") != "ok" and step["ok"]:
                step["ok"], step["error"] = False, f"run {ev.get('status')}: {ev.get('error')}"
    if "torch.profiler" in names.get("0", "") and "0" in tiers and "2" in tiers:
        # The command ran once, under the profiler, for its output and Tier 2's table:
        # Tier 2 took that run plus reading its profiles, and is counted so.
        t0_wall, t2_wall = tiers["0"]["wall_s"], tiers["2"]["wall_s"]
        tiers["2"].update(wall_s=(t0_wall or 0.0) + (t2_wall or 0.0), folded=True,
                          own_wall_s=t2_wall)
    out["tiers"] = tiers
    return out


def top_kernel_regex(ncu_pass: dict[str, Any]) -> str | None:
    """The top kernel of a by-hand ncu pass (its CSV), as gpuws's Tier 3 would filter it."""
    from gpuws.remote_agent.profilers.ncu_output import regex_escape
    from gpuws.remote_agent.profilers.ncu_reader import read_raw_csv

    totals: dict[str, float] = {}
    try:
        launches = read_raw_csv(ncu_pass.get("stdout") or "")
    except (ValueError, KeyError):
        return None
    for launch in launches:
        dur = (launch.get("metrics") or {}).get("duration_ns")
        if dur is not None:
            totals[launch["kernel"]] = totals.get(launch["kernel"], 0.0) + float(dur)
    if not totals:
        return None
    top = max(totals, key=lambda k: totals[k])
    return str(regex_escape(top.split("(")[0]))


def working_nsys() -> tuple[str | None, str]:
    """A working nsys, or None and why (the one inside ncu writes no report)."""
    from gpuws.remote_agent.pod.tools import nsys_installs

    installs = nsys_installs()
    for inst in installs:
        if not inst.get("error") and inst.get("version"):
            return str(inst["path"]), f"nsys {inst['version']} at {inst['path']}"
    if installs:
        return None, "absent: only " + "; ".join(f"{i['path']} ({i.get('error')})"
                                                 for i in installs)
    return None, "absent: no nsys found"


def by_hand(case: Case, args: argparse.Namespace, tmp: str,
            nsys: str | None) -> dict[str, dict[str, Any]]:
    """The same answers, a step per process, as typed in a shell on the pod."""
    from gpuws.remote_agent.profilers.ncu_cmd import DEFAULT_SECTIONS, build_ncu_argv

    t, dry = args.timeout, args.dry_run
    steps: dict[str, dict[str, Any]] = {}
    python = case.kind == "python"
    if python:
        steps["tier1"] = run_step("do_bench", [args.python, "-c", DO_BENCH, case.workload],
                                  t, dry=dry)
    else:
        steps["tier1"] = run_step("the script alone", case.target, t, dry=dry)
    ncu = args.ncu
    if nsys:
        base = os.path.join(tmp, f"timeline-{case.key}")
        prof = [nsys, "profile", "--trace=cuda", "--force-overwrite=true", "-o", base]
        if python:
            prof += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        a = run_step("nsys profile", prof + case.target, t, dry=dry)
        b = run_step("nsys stats", [nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format",
                                    "csv", "--output", "-", base + ".nsys-rep"], t, dry=dry)
        steps["nsys"] = _joined("nsys profile + stats", a, b)
    if ncu:
        argv = [ncu, "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw",
                "--kernel-name-base", "demangled", "--target-processes", "all",
                "--clock-control", "none"]
        if python:
            argv += ["--profile-from-start", "off"]
        steps["ncu_pass"] = run_step("ncu gpu__time_duration pass", argv + case.target, t,
                                     dry=dry)
        regex = case.regex or top_kernel_regex(steps["ncu_pass"]) or ".*"
        argv = build_ncu_argv(ncu, report_path=os.path.join(tmp, f"profile-{case.key}"),
                              target_argv=case.target, kernel_regex=regex, launch_skip=0,
                              launch_count=1, ncu_set=None, sections=list(DEFAULT_SECTIONS),
                              replay_mode=None, clock_control="none", cache_control="all")
        if python:
            argv[1:1] = ["--profile-from-start", "off"]
        steps["tier3"] = run_step(f"ncu default sections, 1 launch of {regex}", argv, t,
                                  dry=dry)
        steps["ncu_pass"]["stdout"] = ""  # parsed above; the CSV is not kept
    else:
        for key in ("ncu_pass", "tier3"):
            steps[key] = {"name": key, "argv": [], "ok": False, "wall_s": None,
                          "error": "no ncu (give --ncu)"}
    steps["tier2"] = steps["nsys"] if nsys and steps["nsys"]["ok"] else steps["ncu_pass"]
    for step in steps.values():
        step.pop("stdout", None)
    return steps


def _joined(name: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    ok = a["ok"] and b["ok"]
    return {"name": name, "argv": [a["argv"], b["argv"]], "ok": ok,
            "wall_s": (a["wall_s"] or 0.0) + (b["wall_s"] or 0.0) if ok else None,
            "error": a["error"] or b["error"], "rc": b["rc"] if a["ok"] else a["rc"]}


# ---------------------------------------------------------------------- summary
def _median(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def summarize(raw: dict[str, list[dict[str, Any]]], machine: dict[str, Any],
              config: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeats, the ratios and the goals, from the raw repeats.

    ``raw[case]`` holds one ``{"gpuws": step, "by_hand": {key: step}}`` per repeat.
    """
    out: dict[str, Any] = {"machine": machine, "config": config, "workloads": {},
                           "goals": {}}
    for key, reps in raw.items():
        g = [r["gpuws"] for r in reps]
        tiers = sorted({t for r in g for t in r.get("tiers", {})})
        gpuws = {
            "wall_s": _median([r["wall_s"] if r["ok"] else None for r in g]),
            "walls_s": [r["wall_s"] for r in g],
            "ok": all(r["ok"] for r in g),
            "errors": [r["error"] for r in g if r["error"]],
            "tiers": {t: {"wall_s": _median([r["tiers"].get(t, {}).get("wall_s") for r in g]),
                          "answer_at_s": _median([r["tiers"].get(t, {}).get("answer_at_s")
                                                  for r in g]),
                          "status": g[-1]["tiers"].get(t, {}).get("status"),
                          "source": g[-1]["tiers"].get(t, {}).get("source"),
                          "folded": bool(g[-1]["tiers"].get(t, {}).get("folded"))}
                      for t in tiers},
            "kernel_table_source": g[-1].get("kernel_table_source"),
            "top_kernel": g[-1].get("top_kernel"),
            "argv": g[-1]["argv"],
        }
        hand: dict[str, Any] = {}
        for step_key in reps[0]["by_hand"]:
            steps = [r["by_hand"][step_key] for r in reps]
            hand[step_key] = {"name": steps[-1]["name"], "argv": steps[-1]["argv"],
                              "wall_s": _median([s["wall_s"] if s["ok"] else None
                                                 for s in steps]),
                              "walls_s": [s["wall_s"] for s in steps],
                              "ok": all(s["ok"] for s in steps),
                              "errors": [s["error"] for s in steps if s["error"]]}
        parts = [hand[k]["wall_s"] for k in ("tier1", "tier2", "tier3")]
        hand_sum = sum(p for p in parts if p is not None) if None not in parts else None
        ratio = (gpuws["wall_s"] / hand_sum
                 if gpuws["wall_s"] is not None and hand_sum else None)
        out["workloads"][key] = {"gpuws": gpuws, "by_hand": hand, "by_hand_sum_s": hand_sum,
                                 "ratio": ratio,
                                 "met": ratio is not None and ratio <= GOAL_RATIO}
    tfm = out["workloads"].get("transformer")
    if tfm is not None:
        t2 = tfm["gpuws"]["tiers"].get("2", {}).get("wall_s")
        whole = tfm["gpuws"]["wall_s"]
        out["goals"] = {
            "transformer_tier2_s": {"value": t2, "goal": GOAL_TFM_TIER2_S,
                                    "met": t2 is not None and t2 <= GOAL_TFM_TIER2_S},
            "transformer_whole_s": {"value": whole, "goal": GOAL_TFM_WHOLE_S,
                                    "met": whole is not None and whole <= GOAL_TFM_WHOLE_S},
        }
    out["goals"]["ratio"] = {key: {"value": w["ratio"], "goal": GOAL_RATIO, "met": w["met"]}
                             for key, w in out["workloads"].items()}
    return out


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s"


#: Per tier: the tier, the by-hand step it is set beside, its label, and the by-hand step
#: in words (for a ``cmd:``, Tier 0 — the command alone — stands in Tier 1's row).
ROWS = (
    ("1", "tier1", "Tier 1", "do_bench"),
    ("2", "tier2", "Tier 2", "ncu gpu__time_duration pass (nsys where it works)"),
    ("3", "tier3", "Tier 3", "ncu default sections, 1 launch"),
)


def table(summary: dict[str, Any]) -> str:
    """The printed table: per workload each tier beside its by-hand step, then the goals."""
    m, c = summary["machine"], summary["config"]
    lines = [f"time to an answer · {m.get('gpu') or 'no GPU?'} · driver {m.get('driver')} · "
             f"{m.get('ncu') or 'no ncu'} · nsys {m.get('nsys')} · median of {c['repeats']}",
             f"{'workload':<12} {'step':<7} {'gpuws':>8} {'by hand':>8}  "
             "gpuws's path | the by-hand step"]
    for key, w in summary["workloads"].items():
        g, h = w["gpuws"], w["by_hand"]
        first = True
        for tier, hkey, label, hand_what in ROWS:
            gt = g["tiers"].get(tier) or {}
            if tier == "1" and "0" in g["tiers"]:
                gt, label, hand_what = g["tiers"]["0"], "Tier 0", "the command alone"
            path = gt.get("source") or gt.get("status") or "—"
            if gt.get("folded"):
                path += " (the Tier 0 run itself: its time is counted in both rows)"
            lines.append(f"{key if first else '':<12} {label:<7} {_s(gt.get('wall_s')):>8} "
                         f"{_s(h.get(hkey, {}).get('wall_s')):>8}  {path} | {hand_what}")
            first = False
        ratio = w["ratio"]
        verdict = "—" if ratio is None else (
            f"{ratio:.2f}× (goal ≤ {GOAL_RATIO}×: {'met' if w['met'] else 'NOT met'})")
        lines.append(f"{'':<12} {'whole':<7} {_s(g['wall_s']):>8} {_s(w['by_hand_sum_s']):>8}"
                     f"  gpuws run process | by-hand sum: {verdict}")
        for err in g["errors"][:1] + [e for s in h.values() for e in s["errors"][:1]]:
            lines.append(f"{'':<12} ! {err[:110]}")
    goals = summary["goals"]
    if "transformer_tier2_s" in goals:
        t2, whole = goals["transformer_tier2_s"], goals["transformer_whole_s"]
        lines.append(f"transformer: Tier 2 {_s(t2['value'])} (goal ≤ {t2['goal']:g} s: "
                     f"{'met' if t2['met'] else 'NOT met'}), whole run {_s(whole['value'])} "
                     f"(goal ≤ {whole['goal']:g} s: {'met' if whole['met'] else 'NOT met'})")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the machine
def machine(ncu: str | None, nsys_note: str, python: str) -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {"nsys": nsys_note, "python": python}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip().splitlines()
        name, driver = [*smi[0].split(", "), "?"][:2] if smi else (None, None)
        info.update(gpu=name, driver=driver, gpus=len(smi))
    except (OSError, subprocess.TimeoutExpired) as exc:
        info.update(gpu=None, driver=None, gpu_error=str(exc))
    if ncu:
        try:
            out = subprocess.run([ncu, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.strip().splitlines()
            info["ncu"] = out[-1] if out else ncu
        except (OSError, subprocess.TimeoutExpired):
            info["ncu"] = ncu
    try:
        info["torch"] = subprocess.run(
            [python, "-c", "import torch, cupy; print(torch.__version__, cupy.__version__)"],
            capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["torch"] = None
    info["cpu_count"] = os.cpu_count()
    info["loadavg"] = os.getloadavg()
    return info


def default_ncu() -> str | None:
    """The ncu gpuws selects for this machine (the resolved install, as bench/tier3.py)."""
    try:
        from gpuws.remote_agent.profilers.ncu_provision import current_plan

        selected = current_plan().get("selected")
        return str(selected) if selected else None
    except Exception:  # no GPU, no driver: the steps that need ncu say so
        return shutil.which("ncu")


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", metavar="PATH", help="write every figure as JSON here")
    ap.add_argument("--workloads", default=",".join(CASES),
                    help=f"comma-separated, from {', '.join(CASES)} (default: all)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="repetitions of every step (medians are reported; default 1)")
    ap.add_argument("--timeout", type=float, default=180.0,
                    help="seconds one step may take before it is killed and reported")
    ap.add_argument("--python", default=sys.executable,
                    help="the python with CuPy, torch and triton (the pod's python3)")
    ap.add_argument("--ncu", help="ncu for the by-hand steps (default: the one gpuws selects)")
    ap.add_argument("--max-seconds", type=float,
                    help="gpuws run --max-seconds (default: gpuws's own default)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed first start (agent deploy, CuPy kernel compile)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands that would run; run nothing")
    args = ap.parse_args(argv)
    args.cases = [c.strip() for c in args.workloads.split(",") if c.strip()]
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ncu is None and not args.dry_run:
        args.ncu = default_ncu()
    nsys, nsys_note = (None, "not looked for (dry run)") if args.dry_run else working_nsys()
    chosen = cases(args.python, args.cases)
    raw: dict[str, list[dict[str, Any]]] = {c.key: [] for c in chosen}
    with tempfile.TemporaryDirectory(prefix="gpuws-answer-") as tmp:
        # The runs go to a store and a pod cache of their own, not the person's.
        # Unbuffered: a run killed at its timeout has still printed its run id (to cancel).
        env = dict(os.environ, GPUWS_HOME=os.path.join(tmp, "home"),
                   GPUWS_POD_CACHE=os.path.join(tmp, "pod-cache"), PYTHONUNBUFFERED="1")
        if args.dry_run:
            args.ncu = args.ncu or "ncu"
            for case in chosen:
                g = gpuws_run(case, args, env)
                steps = by_hand(case, args, tmp, nsys)
                print(f"# {case.key}\n$ " + _shell(g["argv"]))
                for key, step in steps.items():
                    if key != "tier2":  # the same step as nsys or ncu_pass
                        print("$ " + _shell(step["argv"]))
            return 0
        warm = {}
        if not args.no_warmup:
            # Untimed: the agent's first deploy into the pod cache, CuPy's kernel compile
            # cache, the page cache for torch's libraries. Both sides gain from it alike.
            t0 = time.perf_counter()
            run_step("warm-up doctor", [sys.executable, "-c", GPUWS, "doctor", "local",
                                        "--python", args.python], args.timeout, env=env)
            for case in chosen:
                run_step(f"warm-up {case.key}", case.target, args.timeout)
            warm["s"] = time.perf_counter() - t0
        for rep in range(args.repeats):
            for case in chosen:
                # Alternate which side goes first, so drift hurts both alike.
                if rep % 2 == 0:
                    g = gpuws_run(case, args, env)
                    h = by_hand(case, args, tmp, nsys)
                else:
                    h = by_hand(case, args, tmp, nsys)
                    g = gpuws_run(case, args, env)
                raw[case.key].append({"gpuws": g, "by_hand": h})
                print(f"[{rep + 1}/{args.repeats}] {case.key}: gpuws {_s(g['wall_s'])}, "
                      f"by hand " + ", ".join(f"{k} {_s(s['wall_s'])}" for k, s in h.items()
                                              if k != "tier2"), flush=True)
    config = {"repeats": args.repeats, "timeout_s": args.timeout, "python": args.python,
              "ncu": args.ncu, "max_seconds": args.max_seconds, "warmup_s": warm.get("s"),
              "profile_iters": PROFILE_ITERS, "workloads": [c.workload for c in chosen]}
    summary = summarize(raw, machine(args.ncu, nsys_note, args.python), config)
    summary["raw"] = raw
    print(table(summary))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0


def _shell(argv: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


if __name__ == "__main__":
    sys.exit(main())
