"""The pod at a glance: system, GPUs, driver and CUDA, toolkits, CuPy/torch, nsys."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from .... import protocol
from ....gpu import gpus
from ....text.textsafe import visible
from ... import fmt


class PodInfo(Static):
    """Renders a :class:`~gpuws.protocol.Probe`."""

    DEFAULT_CSS = """
    PodInfo { height: auto; padding: 0 1; }
    """

    def show(self, probe: protocol.Probe | None) -> None:
        """Redraw from the probe (``None``: not probed yet)."""
        self.update(render_probe(probe) if probe is not None else Text("probing…", "dim"))


def render_probe(p: protocol.Probe) -> Text:
    """The probe as a few labelled lines (every value the pod's word, made visible)."""
    text = Text()
    where = " · ".join(x for x in (p.hostname, p.os, p.arch) if x)
    text.append(visible(where, 400), "bold")
    if p.container:
        text.append(" · container", "dim")
    text.append("\n" + visible(
        f"{p.user} (uid {p.uid}) · {p.cpu_count or '?'} CPUs · "
        f"{fmt.size((p.memory_total_mib or 0) * 2**20) if p.memory_total_mib else '?'}"
        f" RAM · python {p.python_version}", 400))
    if not p.gpus:
        text.append("\nno GPU: ", "bold red")
        text.append(visible(p.gpu_error or "none found"))
    for g in p.gpus:
        text.append_text(render_gpu(g))
    if p.gpus and p.gpu_error:  # e.g. the pod listed more GPUs than the boundary keeps
        text.append("\n! ", "bold yellow")
        text.append(visible(p.gpu_error, 300), "yellow")
    text.append("\ndriver ", "bold")
    text.append(visible(f"{p.driver or '—'} · CUDA {p.cuda_driver or '—'}", 200))
    text.append("\ntoolkits ", "bold")
    text.append(visible(_tools(p.toolkits, "no CUDA toolkit found")))
    text.append("\npython ", "bold")
    text.append(visible(" · ".join(_package(pkg) for pkg in p.python_packages)) or "—")
    if (py := p.python_choice) is not None:  # which interpreter those are, and how chosen
        text.append(f" · {visible(py.path, 120)} ({visible(py.how, 20)})", "dim")
    text.append("\nnsys ", "bold")
    text.append(visible(_tools(p.nsys, "not found (Tier 2 falls back to torch.profiler or ncu)")))
    return text


def render_gpu(g: protocol.Gpu) -> Text:
    """One GPU in two or three lines: what it is; memory, clocks, power, heat; who uses it."""
    text = Text()
    cc = f"sm_{g.compute_capability.replace('.', '')}" if g.compute_capability else "sm_?"
    sms = f" · {g.sm_count} SMs" if g.sm_count else ""
    text.append(f"\nGPU {g.index} ", "bold")
    text.append(visible(g.name, 60), "bold cyan")
    text.append(visible(f" · {cc}{sms}", 60))
    now = [f"mem {gpus.memory(g)}"]
    if g.sm_clock_mhz is not None or g.sm_clock_max_mhz is not None:
        now.append(f"SM {gpus.clocks(g)}")
    if g.power_w is not None:
        now.append(gpus.power(g))
    if g.temp_c is not None:
        now.append(fmt.celsius(g.temp_c))
    text.append("\n  " + " · ".join(now), "dim")
    if g.clock_events:
        text.append(f" · {visible(gpus.events(g.clock_events))}", "dim")
    if g.processes:
        text.append(f"\n  busy: {visible(gpus.processes(g.processes))}", "yellow")
    return text


def _tools(installs: list[protocol.ToolInstall], none: str) -> str:
    if not installs:
        return none
    parts = []
    for t in installs:
        label = f"{t.version or '?'} ({t.path})"
        parts.append(f"{label} — {t.error}" if t.error else label)
    return "; ".join(parts)


def _package(pkg: protocol.PyPackage) -> str:
    if pkg.error or pkg.version is None:
        return f"{pkg.name}: {pkg.error or 'not installed'}"
    cuda = f" (CUDA {pkg.cuda})" if pkg.cuda else ""
    return f"{pkg.name} {pkg.version}{cuda}"
