"""``gpuws doctor HOST``: deploy the agent, probe the pod, print the picture."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import msgspec
from rich.table import Table
from rich.text import Text

from .. import protocol
from ..client import AgentClient
from ..config import load_config, withheld_defaults, withheld_note
from ..errors import AuthError, ConnectError, GpuwsError, HostKeyError, UsageError
from ..gpu import evidence, gpus
from ..live.uptime import lease as podlease
from ..live.uptime import observed
from ..protocol import Gpu, NsysPlan, Probe
from ..sessions.store import Store
from ..text import humanfmt
from ..text.textsafe import text as safe
from ..text.textsafe import visible
from .common import connect, console, print_json


async def doctor(args: argparse.Namespace) -> int:
    install = bool(getattr(args, "install_nsys", False))
    if install and not args.yes and not sys.stdin.isatty():
        # Refused before connecting: nothing can be asked, and nothing changes unasked.
        raise UsageError("--install-nsys changes the pod and there is no terminal to ask on",
                         remedy="run it on a terminal, or add --yes to confirm in advance")
    t0 = time.monotonic()
    try:
        client = await connect(args)
    except (HostKeyError, AuthError):
        raise
    except ConnectError:
        with Store() as store:  # a silence after the lease's deadline is its stop
            said = observed.host_silent(store, args.host)
        if said is not None:
            print(f"gpuws: {said}", file=sys.stderr)
        raise
    code = 0
    try:
        probe = await client.probe()
        report = doctor_report(args.host, client, probe, time.monotonic() - t0)
        t1 = time.monotonic()
        plan = await client.nsys_plan()
        report["nsys"]["plan"] = msgspec.to_builtins(plan)
        report["timings"]["nsys_plan_s"] = time.monotonic() - t1
        here = podlease.is_this_machine(probe)
        lease = await podlease.arm(client, args.host, this_machine=here)
        withheld = withheld_defaults(load_config(), args.host, this_machine=here)
        if withheld:  # said once, before the report: why no lease where [defaults] has one
            print(f"gpuws: note: {withheld_note(args.host, withheld)}", file=sys.stderr)
        with Store() as store:
            learnt, denied = observed.lease_seen(store, args.host, lease, time.time())
        report["lease"] = dict(msgspec.to_builtins(lease), said=podlease.describe(lease),
                               stops_recorded=learnt, stops_denied=denied,
                               not_believed=observed.disbelief(lease, denied),
                               this_machine=here,
                               withheld_defaults=withheld)
        if not args.json:
            render(report)
        if install:
            plan, code = await install_nsys(client, plan, yes=args.yes, as_json=args.json)
            report["nsys"]["plan"] = msgspec.to_builtins(plan)
    finally:
        await client.close()
        with Store() as store:
            observed.contact(store, args.host, time.time())
    if args.json:
        print_json(report)
    return code


def doctor_report(host: str, client: AgentClient, probe: Probe, total_s: float) -> dict[str, Any]:
    """The doctor's JSON: stable keys that scripts and CI rely on."""
    p: dict[str, Any] = msgspec.to_builtins(probe)
    info = client.transport.info
    return {
        "host": host,
        "agent": {"version": client.hello.agent_version, "sha256": client.hello.agent_sha256,
                  "cache_state": client.deploy.cache_state,
                  "bundle_bytes": client.deploy.bundle_size,
                  "transferred_bytes": client.deploy.transferred},
        "python": {"version": probe.python_version, "path": probe.python_path},
        "system": {k: p[k] for k in ("hostname", "os", "kernel", "arch", "container",
                                     "virtualization", "cpu_count", "memory_total_mib",
                                     "user", "uid", "home")},
        "gpus": p["gpus"],
        "gpu_source": probe.gpu_source,
        "gpu_error": probe.gpu_error,
        "driver": probe.driver,
        "cuda_driver": probe.cuda_driver,
        "toolkits": p["toolkits"],
        "python_packages": p["python_packages"],
        "python_choice": p["python_choice"],
        "ncu": {"installs": p["ncu"]},
        "nsys": {"installs": p["nsys"]},
        "counters": p["counters"],
        "transport": {"kind": info.kind, "sftp": info.sftp, "notes": info.notes},
        "timings": {"connect_s": info.connect_s, "deploy_s": client.deploy.deploy_s,
                    "probe_s": probe.probe_s, "total_s": total_s},
    }


def _na(value: Any) -> str:
    return "—" if value in (None, "", []) else str(value)


def python_text(agent: dict[str, Any], choice: dict[str, Any] | None) -> Text:
    """Which Python runs the workloads and why (``python_choice``), and the agent's own
    when it differs; an agent without the choice shows only its own."""
    own = safe(f"{agent['version']} at {agent['path']}")
    if not choice:
        return own
    colour = {"fallback": "yellow", "found": "green"}.get(choice["how"], "")
    out = Text.assemble(safe(choice["path"], "bold"),
                        f" (Python {visible(choice.get('version') or '?', 40)}, ",
                        (visible(choice["how"], 20), colour), ")\n", safe(choice["reason"]))
    if choice["path"] != agent["path"]:
        out.append("\nthe agent itself runs on ")
        out.append_text(own)
    return out


def render(r: dict[str, Any]) -> None:
    # No markup: every value below is the pod's word (a hostname may hold "[/]").
    out = console(markup=False)
    s = r["system"]
    out.print(Text.assemble(("gpuws doctor", "bold"), " · ", safe(r["host"]), " · ",
                            safe(s["hostname"])))
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan")
    t.add_column()
    # Every value is the pod's word: visible() keeps its escapes from the terminal and its
    # newlines from drawing rows of their own (the newlines joining lines here are ours).
    t.add_row("system", visible(f"{s['os']} · kernel {s['kernel']} · {s['arch']} · "
                                f"{_na(s['cpu_count'])} CPUs · "
                                f"{humanfmt.mib(s['memory_total_mib'])} memory"))
    hints = s["container"] + s["virtualization"]
    t.add_row("container/VM", visible(", ".join(hints)) if hints else "none detected")
    t.add_row("user", visible(f"{s['user']} (uid {s['uid']})"))
    t.add_row("python", python_text(r["python"], r.get("python_choice")))
    t.add_row("driver", visible(f"{_na(r['driver'])} (supports CUDA {_na(r['cuda_driver'])})"))
    t.add_row("toolkits", visible(", ".join(f"{k['version'] or '?'} ({k['path']})"
                                            for k in r["toolkits"]) or "no nvcc found"))
    pk = [f"{x['name']}: {x['error']}" if x.get("error") and not x.get("version") else
          f"{x['name']} {x['version'] or '?'}" + (f" (CUDA {x['cuda']})" if x.get("cuda") else "")
          for x in r["python_packages"]]
    t.add_row("CuPy/torch", visible(", ".join(pk)) or "neither installed")
    for tool in ("ncu", "nsys"):
        inst = r[tool]["installs"]
        t.add_row(tool, "\n".join(visible(f"{i['version'] or 'version unknown'}  {i['path']}"
                                          + (f"  ({i['error']})" if i.get("error") else ""))
                                  for i in inst) or "not found")
    if r["nsys"].get("plan") is not None:
        t.add_row("nsys plan", nsys_plan_text(msgspec.convert(r["nsys"]["plan"], NsysPlan)))
    c = r["counters"]
    colour = {"allowed": "green", "blocked": "red"}.get(c["verdict"], "yellow")
    verdict = c["verdict"] if c["verdict"] in ("allowed", "blocked") else "unknown"
    t.add_row("counters", Text.assemble((verdict, colour), " — ", safe(c["reason"])))
    tr = r["transport"]
    if r.get("lease"):
        armed, learnt = r["lease"]["armed"], r["lease"].get("stops_recorded", 0)
        said = visible(r["lease"]["said"]) + (
            f"\nthe lease stopped the pod {learnt} time(s) since gpuws last saw it: "
            "recorded for the export's billed time" if learnt else "") + (
            "\n" + r["lease"]["not_believed"] if r["lease"].get("not_believed") else "")
        t.add_row("lease", Text(said, "green" if armed else "yellow"))
    t.add_row("transport", f"{tr['kind']}" + (", SFTP" if tr["sftp"] else ", no SFTP")
              + "".join(f"\n{visible(n)}" for n in tr["notes"]))
    ag = r["agent"]
    t.add_row("agent", visible(f"{ag['version']} sha256 {ag['sha256'][:12]}… "
                               f"({ag['cache_state']}, sent "
                               f"{humanfmt.size(ag['transferred_bytes'])})"))
    tm = r["timings"]
    t.add_row("timings", f"connect {humanfmt.duration(tm['connect_s'])} · deploy "
                         f"{humanfmt.duration(tm['deploy_s'])} · probe "
                         f"{humanfmt.duration(tm['probe_s'])}")
    out.print(t)
    if r["gpus"]:
        out.print(gpu_table(msgspec.convert(r["gpus"], list[Gpu])))
        if r["gpu_error"]:  # e.g. the list was cut at the boundary's bound
            out.print(Text.assemble(("! ", "bold yellow"), safe(r["gpu_error"], "yellow")))
    else:
        out.print(Text.assemble(("GPUs: none", "yellow"), " — ",
                                safe(r["gpu_error"] or "no NVIDIA GPU found")))


def gpu_table(gpus_: list[Gpu]) -> Table:
    """Every GPU of the pod: what it is, how full and fast it is now, and who uses it."""
    g = Table(title=f"GPUs ({len(gpus_)})", title_justify="left")
    for col in ("#", "GPU", "memory used", "SM clock", "power", "temp", "clock events",
                "used by"):
        g.add_column(col, justify="right" if col in ("#", "temp") else "left",
                     overflow="fold")
    for gpu in gpus_:
        ident = safe(gpu.name, "bold")
        if gpu.uuid:
            ident.append("\n" + visible(gpu.uuid, 80), "dim")
        if gpu.compute_capability:
            ident.append(f"\nCC {visible(gpu.compute_capability, 10)}", "dim")
        gpm = evidence.gpm_probe_line(gpu)
        if gpm is not None:
            ident.append(f"\n{gpm}", "dim")
        busy = bool(gpu.processes)
        g.add_row(str(gpu.index), ident, gpus.memory(gpu), gpus.clocks(gpu), gpus.power(gpu),
                  humanfmt.celsius(gpu.temp_c), gpus.events(gpu.clock_events),
                  safe(gpus.processes(gpu.processes), "yellow" if busy else ""))
    return g


# ---------------------------------------------------------------------- Nsight Systems
def nsys_plan_text(plan: NsysPlan) -> Text:
    """The nsys Tier 2 uses, or why there is none and what installing one would do, in
    words; pod text is shown literally."""
    if plan.selected:
        out = Text.assemble(("works", "green"), ": ", safe(
            f"nsys {plan.selected_version or '?'} at {plan.selected} (Tier 2's timeline)"))
    else:
        out = Text.assemble(("none works", "yellow"), ": ", safe(plan.reason),
                            " — Tier 2 uses torch.profiler or one ncu pass")
        if plan.install_plan and not plan.installed:
            out.append_text(Text.assemble(
                "\ninstall plan: ", safe(plan.install_how or "?"),
                f"; {len(plan.install_plan)} steps, run only with --install-nsys (asks first)"))
            for step in plan.install_plan:
                out.append_text(safe("\n  $ " + " ".join(step), "dim"))
    if plan.verified:
        out.append_text(Text.assemble("\n", ("verified", "green"), ": ", safe(plan.verified)))
    return out


async def install_nsys(client: AgentClient, plan: NsysPlan, *, yes: bool,
                       as_json: bool) -> tuple[NsysPlan, int]:
    """Run the pod's nsys install plan once the person confirms; the plan after it and
    the exit status.

    Raises:
        GpuwsError: the pod has no plan (the reason says what to do instead).
        AgentError: a step failed, or the nsys it installed failed its verification.
    """
    out = console(stderr=as_json, markup=False)
    if plan.selected:
        out.print(safe(f"nsys {plan.selected_version or '?'} already works at "
                       f"{plan.selected}: nothing to install"))
        return plan, 0
    if not plan.install_plan:
        raise GpuwsError(f"no nsys install plan for this pod: {visible(plan.reason)}",
                         title="Cannot install nsys",
                         remedy="install Nsight Systems by hand "
                                "(developer.nvidia.com/nsight-systems)")
    if not yes:
        out.print(Text.assemble("These commands run on the pod, ", safe(plan.install_how),
                                ":", *(safe("\n  $ " + " ".join(step), "bold")
                                       for step in plan.install_plan)))
        question = f"Install {visible(plan.install_target or 'nsys', 80)} on the pod? [y/N] "
        if not await asyncio.to_thread(ask, question):
            out.print(Text("Nothing was installed."))
            return plan, 0

    def show_step(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Log) and ev.run_id is None:
            out.print(safe(ev.message, "dim"))

    client.add_listener(show_step)
    try:
        after = await client.nsys_plan(install=True)
    finally:
        client.remove_listener(show_step)
    out.print(Text.assemble(("installed", "green bold"), " ", nsys_plan_text(after)))
    return after, 0


def ask(question: str) -> bool:
    """A y/N question on the terminal (on stderr, so --json's stdout stays JSON)."""
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")
