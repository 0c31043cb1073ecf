"""``gpuws doctor HOST``: deploy the agent, probe the pod, print the picture."""

from __future__ import annotations

import argparse
import time
from typing import Any

import msgspec
from rich.table import Table

from .. import humanfmt
from ..client import AgentClient
from ..protocol import Probe
from .common import connect, console, print_json


async def doctor(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    client = await connect(args)
    try:
        probe = await client.probe()
        report = doctor_report(args.host, client, probe, time.monotonic() - t0)
    finally:
        await client.close()
    if args.json:
        print_json(report)
    else:
        render(report)
    return 0


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
        "ncu": {"installs": p["ncu"]},
        "nsys": {"installs": p["nsys"]},
        "counters": p["counters"],
        "transport": {"kind": info.kind, "sftp": info.sftp, "notes": info.notes},
        "timings": {"connect_s": info.connect_s, "deploy_s": client.deploy.deploy_s,
                    "probe_s": probe.probe_s, "total_s": total_s},
    }


def _na(value: Any) -> str:
    return "—" if value in (None, "", []) else str(value)


def render(r: dict[str, Any]) -> None:
    out = console()
    s = r["system"]
    out.print(f"[bold]gpuws doctor[/] · {r['host']} · {s['hostname']}")
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan")
    t.add_column()
    t.add_row("system", f"{s['os']} · kernel {s['kernel']} · {s['arch']} · "
                        f"{_na(s['cpu_count'])} CPUs · {humanfmt.mib(s['memory_total_mib'])} "
                        "memory")
    hints = s["container"] + s["virtualization"]
    t.add_row("container/VM", ", ".join(hints) if hints else "none detected")
    t.add_row("user", f"{s['user']} (uid {s['uid']})")
    t.add_row("python", f"{r['python']['version']} at {r['python']['path']}")
    t.add_row("driver", f"{_na(r['driver'])} (supports CUDA {_na(r['cuda_driver'])})")
    t.add_row("toolkits", ", ".join(f"{k['version'] or '?'} ({k['path']})" for k in r["toolkits"])
              or "no nvcc found")
    pk = [f"{x['name']}: {x['error']}" if x.get("error") and not x.get("version") else
          f"{x['name']} {x['version'] or '?'}" + (f" (CUDA {x['cuda']})" if x.get("cuda") else "")
          for x in r["python_packages"]]
    t.add_row("CuPy/torch", ", ".join(pk) or "neither installed")
    for tool in ("ncu", "nsys"):
        inst = r[tool]["installs"]
        t.add_row(tool, "\n".join(f"{i['version'] or 'version unknown'}  {i['path']}"
                                  + (f"  ({i['error']})" if i.get("error") else "")
                                  for i in inst) or "not found")
    c = r["counters"]
    verdict = {"allowed": "[green]allowed[/]", "blocked": "[red]blocked[/]"}.get(
        c["verdict"], "[yellow]unknown[/]")
    t.add_row("counters", f"{verdict} — {c['reason']}")
    tr = r["transport"]
    t.add_row("transport", f"{tr['kind']}" + (", SFTP" if tr["sftp"] else ", no SFTP")
              + "".join(f"\n{n}" for n in tr["notes"]))
    ag = r["agent"]
    t.add_row("agent", f"{ag['version']} sha256 {ag['sha256'][:12]}… "
                       f"({ag['cache_state']}, sent {humanfmt.size(ag['transferred_bytes'])})")
    tm = r["timings"]
    t.add_row("timings", f"connect {humanfmt.duration(tm['connect_s'])} · deploy "
                         f"{humanfmt.duration(tm['deploy_s'])} · probe "
                         f"{humanfmt.duration(tm['probe_s'])}")
    out.print(t)
    if r["gpus"]:
        g = Table(title="GPUs", title_justify="left")
        for col in ("#", "name", "UUID", "memory", "SM clock", "CC"):
            g.add_column(col)
        for gpu in r["gpus"]:
            g.add_row(str(gpu["index"]), gpu["name"], _na(gpu.get("uuid")),
                      humanfmt.mib(gpu.get("memory_total_mib") or None),
                      f"{_mhz(gpu.get('sm_clock_mhz'))} / {_mhz(gpu.get('sm_clock_max_mhz'))}"
                      " MHz", _na(gpu.get("compute_capability")))
        out.print(g)
    else:
        out.print(f"[yellow]GPUs: none[/] — {r['gpu_error'] or 'no NVIDIA GPU found'}")


def _mhz(v: float | None) -> str:
    # nvidia-smi reports whole MHz; a float from the JSON must not print as 1980.0.
    return humanfmt.num(v)
