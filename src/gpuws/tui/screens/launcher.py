"""The run launcher: workload, GPU, tiers, Tier 1 and Tier 3 options, a baseline to compare
with. The GPU field lists the pod's GPUs from its probe; one that other processes use is
named before the run starts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import (
    Button,
    Checkbox,
    Footer,
    Header,
    Input,
    Label,
    RadioSet,
    Select,
    Static,
)

from ... import protocol
from ...errors import GpuwsError, UsageError
from ...gpu import gpus
from ...kernels.registry import BUILTINS, WorkloadError, WorkloadRef, parse_workload
from ...kernels.workload import ParamValue
from ...runspec import LaunchOptions, build_spec, parse_target_ci
from ...text.textsafe import visible
from ..widgets.marked import MarkedCheckbox, MarkedRadioButton
from .confirm import ConfirmScreen

if TYPE_CHECKING:
    from ..app import GpuwsApp

#: Section sets of Nsight Compute 2025.x (``ncu --list-sets``); blank = the focused default.
NCU_SETS = ("basic", "detailed", "full", "roofline", "pmsampling", "nvlink")
REPLAY_MODES = ("kernel", "application", "range", "app-range")


class LauncherScreen(Screen[None]):
    """A form that builds a RunSpec exactly as ``gpuws run`` does (``runspec.build_spec``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "launch", "Launch", priority=True),
        Binding("ctrl+t", "watch", "Watch", priority=True),
        Binding("escape", "back", "Back"),
        Binding("question_mark", "app.help", "Help", show=False),
    ]
    DEFAULT_CSS = """
    LauncherScreen VerticalScroll { padding: 0 1; }
    LauncherScreen .section { text-style: bold; background: $boost; width: 100%;
                              padding: 0 1; margin-top: 1; }
    LauncherScreen .row { height: auto; margin-top: 1; }
    LauncherScreen .row > Label { width: 18; padding: 0 1 0 0; }
    LauncherScreen .row > Input { width: 1fr; }
    LauncherScreen .row > Select { width: 1fr; }
    /* Wrapped, never cut: a help line or the no-GPU note ran off the right edge
       ("(no NVIDIA driver: libnvidia-ml.so.1" at 80 columns, its remedy even at 160). */
    LauncherScreen .help { color: $text-muted; padding: 0 0 0 18; width: 100%;
                           height: auto; }
    LauncherScreen #kind { layout: horizontal; height: auto; width: 100%; }
    LauncherScreen #builtin-box, LauncherScreen #params { height: auto; }
    LauncherScreen #tiers { height: auto; margin-top: 1; }
    LauncherScreen #tiers Checkbox { margin-right: 2; }
    LauncherScreen #tiers Checkbox { width: auto; }
    LauncherScreen #error { color: $error; padding: 0 1; }
    LauncherScreen #gpu-note { color: $warning; width: 100%; }
    LauncherScreen #buttons { height: auto; margin: 1 0; }
    LauncherScreen #buttons Button { margin-right: 2; }
    """

    #: The focus starts in the chosen kind's field (see ``on_mount``), whatever was
    #: prefilled: it started on the kind's buttons when the form opened empty and in the
    #: command box when a command was remembered, so typing a command went nowhere.
    AUTO_FOCUS = None

    app: GpuwsApp

    def __init__(self, baselines: list[tuple[str | Text, str]],
                 probe: protocol.Probe | None = None, workload: str | None = None) -> None:
        super().__init__()
        self.baselines = baselines
        #: The pod's probe (its GPUs); by default the connected link's.
        self.probe = probe
        #: The workload the form opens on (the one chosen last on this pod), if any.
        self.remembered = workload
        #: Tier 1's tick before a command unticked it (restored for the other kinds).
        self._t1_wanted = True
        #: The kernel whose parameters the form shows.
        self._params_of = ""

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Label("Workload", classes="section")
            with RadioSet(id="kind") as kind:
                kind.compact = True
                yield MarkedRadioButton("bundled kernel", value=True, id="kind-builtin")
                yield MarkedRadioButton("Python file", id="kind-file")
                yield MarkedRadioButton("command", id="kind-cmd")
            with Vertical(id="builtin-box"):
                with Horizontal(classes="row"):
                    yield Label("kernel")
                    yield Select([(f"{b.name} — {b.summary}", b.name) for b in BUILTINS.values()],
                                 value=next(iter(BUILTINS)), allow_blank=False, id="builtin",
                                 compact=True)
                yield Vertical(id="params")
            with Horizontal(classes="row", id="file-box"):
                yield Label("file (here)")
                yield Input(placeholder="bench.py — defines the workload to time", id="file",
                            compact=True)
            with Horizontal(classes="row", id="cmd-box"):
                yield Label("command")
                yield Input(placeholder="python3 train.py --steps 10", id="cmd", compact=True)
            yield from _row("GPU", Select(self._gpu_choices(), value="auto", allow_blank=False,
                                          id="gpu"))
            yield Label("", id="gpu-note", classes="help")
            yield Label(self._no_gpu_note(), id="no-gpu-note", classes="help")
            yield Label("Tiers", classes="section")
            with Horizontal(id="tiers"):
                yield MarkedCheckbox(_T1_LABEL, True, id="t1", compact=True)
                yield MarkedCheckbox("2 kernel timeline", True, id="t2", compact=True)
                yield MarkedCheckbox("3 Nsight Compute", True, id="t3", compact=True)
            yield Label("Tier 1 options", classes="section")
            yield from _row("target CI", Input("1%", id="target-ci",
                                               tooltip="stop when the median's 95% CI is "
                                                       "within ± this of it: 1% (or 0.01), "
                                                       "as gpuws run --target-ci takes it"))
            yield from _row("max seconds", Input("10", id="max-seconds", type="number"))
            yield from _row("timing", Select(
                [("auto: cold, short calls hot in batches", "auto"),
                 ("cold: L2 flushed + 1 ms idle, like ncu", "cold"),
                 ("hot: back to back, L2 warm", "hot")],
                value="auto", allow_blank=False, id="timing"))
            yield Label("Tier 3 options", classes="section")
            yield from _row("kernel regex", Input(placeholder="default: Tier 2's top kernel",
                                                  id="kernel-regex"))
            yield from _row("section set", Select([(s, s) for s in NCU_SETS], id="ncu-set",
                                                  prompt="focused default sections"))
            yield from _row("sections", Input(placeholder="e.g. SpeedOfLight,Occupancy",
                                              id="ncu-sections"))
            yield from _row("launch skip", Input("0", id="launch-skip", type="integer"))
            yield from _row("launch count", Input("1", id="launch-count", type="integer"))
            yield from _row("replay mode", Select([(m, m) for m in REPLAY_MODES],
                                                  id="replay-mode", prompt="ncu's default"))
            yield from _row("clock control", Select([("none (clocks as Tier 1 saw them)", "none"),
                                                     ("base (locked to base clock)", "base")],
                                                    value="none", allow_blank=False,
                                                    id="clock-control"))
            yield Label("Workspace", classes="section")
            yield from _row("project dir", Input(placeholder="optional: a folder here",
                                                  id="workspace"))
            # What the field does, under it: a placeholder cannot wrap, and its end was cut.
            yield Label("synced to the pod before each run, which executes in it (a Python "
                        "file is then a path inside it); with it, Watch re-runs on every "
                        "save in it", classes="help")
            yield from _row("Tier 3 budget", Input(placeholder="seconds (stops a longer plan "
                                                            "before ncu)", id="max-tier3",
                                                   type="number"))
            yield Label("Compare with", classes="section")
            yield from _row("baseline run", Select(self.baselines, id="baseline",
                                                   prompt="the workload's marked baseline"))
            yield Static(id="error")
            with Horizontal(id="buttons"):
                yield Button("Launch (Ctrl+R)", id="launch", variant="success")
                # A loop needs something to watch: a workspace, or a Python file.
                yield Button("Watch (Ctrl+T)", id="watch", disabled=True,
                             tooltip="re-run on every save of the project or file, "
                                     "each iteration compared with the last and the "
                                     "baseline")
                yield Button("Back", id="back")
        yield Footer()

    def _gpu_choices(self) -> list[tuple[str | Text, str]]:
        if self.probe is None and self.app.link is not None:
            self.probe = self.app.link.probe
        choices: list[tuple[str | Text, str]] = [("auto (CUDA's first GPU)", "auto")]
        for g in self.probe.gpus if self.probe is not None else []:
            busy = " · busy" if g.processes else ""
            # Text: a GPU's name is the pod's word, never markup.
            choices.append((Text(f"{g.index} · {visible(g.name, 40)} · {gpus.memory(g)}{busy}"),
                            str(g.index)))
        return choices

    @on(Select.Changed, "#gpu")
    def _gpu_changed(self, event: Select.Changed) -> None:
        note = self.query_one("#gpu-note", Label)
        gpu = self._gpu(str(event.value))
        if gpu is not None and gpu.processes:
            note.update(Text(f"! {gpus.label(gpu.index, gpu.name)} is busy: "
                             f"{gpus.processes(gpu.processes)} — its figures may be slower "
                             "and noisier"))
        else:
            note.update("")
        note.display = gpu is not None and bool(gpu.processes)

    def _gpu(self, value: str) -> protocol.Gpu | None:
        if value == "auto" or self.probe is None:
            return None
        return next((g for g in self.probe.gpus if str(g.index) == value), None)

    def _no_gpu_why(self) -> str | None:
        """Why the probe found no GPU (shown, never markup), or None: the pod has one."""
        if self.probe is None and self.app.link is not None:
            self.probe = self.app.link.probe
        if self.probe is None or self.probe.gpus:
            return None
        return visible(self.probe.gpu_error or "none was found", 200)

    def _no_gpu_note(self) -> Text:
        why = self._no_gpu_why()
        if why is None:
            return Text("")
        return Text(f"! This pod has no GPU ({why}): a bundled kernel or a Python file "
                    "fails at once; a command runs, without Tiers 2 and 3.")

    def on_mount(self) -> None:
        self.query_one("#gpu-note").display = False
        self.query_one("#no-gpu-note").display = bool(self._no_gpu_note().plain)
        self.title = "gpuws · new run"
        self.sub_title = self.app.link_label()
        self._show_kind("builtin")
        self._show_params(str(self.query_one("#builtin", Select).value))
        if self.remembered:
            self._restore(self.remembered)
        self.call_after_refresh(self._focus_kind_field)

    def _focus_kind_field(self) -> None:
        """Put the cursor where the chosen kind is filled in (the kernel, file or command;
        shift+Tab goes back to the kinds)."""
        self.query_one(_KIND_FIELD[self.kind]).focus()

    def _restore(self, workload: str) -> None:
        """Open on the workload chosen last (its kind, kernel and parameters, or its file or
        command); one that no longer parses is left out."""
        try:
            ref = parse_workload(workload)
        except WorkloadError:
            return
        if ref.kind == "builtin" and ref.target not in BUILTINS:
            return
        self.query_one(f"#kind-{ref.kind}", MarkedRadioButton).value = True
        self._show_kind(ref.kind)
        if ref.kind == "builtin":
            self.query_one("#builtin", Select).value = ref.target
            self._show_params(ref.target, ref.params)
        else:
            self.query_one("#file" if ref.kind == "file" else "#cmd", Input).value = ref.target

    def _remember(self) -> None:
        """Keep what the form holds for the next time it opens on this pod (a form that
        does not describe a workload yet leaves the last one remembered)."""
        try:
            workload = self.workload()
        except GpuwsError:
            return
        self.app.remember_workload(workload)

    def action_back(self) -> None:
        """Leave the form; the workload chosen is remembered."""
        self._remember()
        self.app.pop_screen()

    @on(RadioSet.Changed, "#kind")
    def _kind_changed(self, event: RadioSet.Changed) -> None:
        self._show_kind((event.pressed.id or "kind-builtin").removeprefix("kind-"))
        # Picking a kind means filling it in next: go there once the box is shown.
        self.call_after_refresh(self._focus_kind_field)

    def _show_kind(self, kind: str) -> None:
        self.kind = kind
        self._watchable()
        self.query_one("#builtin-box").display = kind == "builtin"
        self.query_one("#file-box").display = kind == "file"
        self.query_one("#cmd-box").display = kind == "cmd"
        # A command has no run() to time: its Tier 1 is always skipped, so it is not
        # offered ticked (it stayed ticked); the other kinds get back what it was.
        t1 = self.query_one("#t1", MarkedCheckbox)
        if kind == "cmd":
            if not t1.disabled:
                self._t1_wanted = t1.value
            t1.value, t1.disabled = False, True
            t1.label = f"{_T1_LABEL} (not for commands)"
        elif t1.disabled:
            t1.value, t1.disabled = self._t1_wanted, False
            t1.label = _T1_LABEL

    @on(Input.Changed, "#workspace")
    def _watchable(self) -> None:
        """Watch is offered when there is something to watch (the button, and the footer's
        ^t, which was offered for every kind)."""
        if self.is_mounted:
            self.query_one("#watch", Button).disabled = not self.can_watch()
            self.refresh_bindings()

    def can_watch(self) -> bool:
        """Whether the form names something to watch: a Python file, or a project dir."""
        return self.kind == "file" or bool(self.query_one("#workspace", Input).value.strip())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "watch":
            # Shown dimmed, not hidden: the footer still says the key exists.
            return True if self.can_watch() else None
        return True

    @on(Select.Changed, "#builtin")
    def _builtin_changed(self, event: Select.Changed) -> None:
        # The form opened on a remembered kernel already shows its parameters as chosen:
        # neither the change message of setting it nor the stale one of the first value
        # may reset them to the defaults.
        value = str(event.value)
        if value == str(event.select.value) and value != self._params_of:
            self._show_params(value)

    def _show_params(self, name: str, given: dict[str, ParamValue] | None = None) -> None:
        box = self.query_one("#params", Vertical)
        box.remove_children()
        self._params_of = name
        spec = BUILTINS.get(name)
        if spec is None:
            return
        rows: list[Widget] = []
        for p in spec.params:
            choices = f" ({'/'.join(p.choices)})" if p.choices else ""
            value = (given or {}).get(p.name, p.default)
            rows.append(Horizontal(Label(p.name), Input(str(value), id=f"param-{p.name}",
                                                        tooltip=p.help, compact=True),
                                   classes="row"))
            rows.append(Label(f"{p.help}{choices}", classes="help"))
        box.mount_all(rows)

    def workload(self) -> str:
        """The workload string the form describes.

        Raises:
            UsageError: a builtin parameter is invalid, or a field is empty.
        """
        if self.kind == "cmd":
            command = self.query_one("#cmd", Input).value
            if not command.strip():
                raise UsageError("type the command to run", remedy="e.g. python3 train.py")
            return f"cmd:{command}"
        if self.kind == "file":
            path = self.query_one("#file", Input).value.strip()
            if not path:
                raise UsageError("type the path of the Python file", remedy="e.g. bench.py")
            return f"file:{path}"
        name = str(self.query_one("#builtin", Select).value)
        given = {p.name: self.query_one(f"#param-{p.name}", Input).value.strip()
                 for p in BUILTINS[name].params}
        changed = {k: v for k, v in given.items()
                   if v != str(next(p.default for p in BUILTINS[name].params if p.name == k))}
        query = "&".join(f"{k}={v}" for k, v in changed.items())
        try:
            ref: WorkloadRef = parse_workload(f"builtin:{name}" + (f"?{query}" if query else ""))
        except WorkloadError as exc:
            raise UsageError(exc.problem, remedy=exc.valid) from None
        return str(ref)

    def options(self) -> LaunchOptions:
        """Everything the form says, as ``gpuws run`` would receive it.

        Raises:
            UsageError: a field does not hold a valid value.
        """
        tiers = ",".join(t for t in "123" if self.query_one(f"#t{t}", Checkbox).value)
        if not tiers and self.kind == "cmd":
            # A command with no tier ticked runs on its own, timed as a whole: what
            # `gpuws run/watch -w cmd:…` does with their default `--tiers 1`, whose Tier 1
            # a command always skips.
            tiers = "1"
        if not tiers:
            raise UsageError("no tier chosen", remedy="tick at least one tier")
        return LaunchOptions(
            workload=self.workload(), tiers=tiers,
            target_ci=parse_target_ci(self.query_one("#target-ci", Input).value),
            max_seconds=_number(self, "#max-seconds", "max seconds"),
            timing=str(self.query_one("#timing", Select).value),
            kernel_regex=self.query_one("#kernel-regex", Input).value.strip() or None,
            launch_skip=int(_number(self, "#launch-skip", "launch skip")),
            launch_count=int(_number(self, "#launch-count", "launch count")),
            ncu_set=_choice(self, "#ncu-set"),
            ncu_sections=self.query_one("#ncu-sections", Input).value.strip() or None,
            replay_mode=_choice(self, "#replay-mode"),
            clock_control=_choice(self, "#clock-control") or "none",
            max_tier3_seconds=_optional_number(self, "#max-tier3", "max Tier 3 seconds"),
            gpu=None if _choice(self, "#gpu") in (None, "auto") else _choice(self, "#gpu"),
            workspace=self.query_one("#workspace", Input).value.strip() or None)

    def action_launch(self) -> None:
        """Build the spec and ask the pod to start it."""
        error = self.query_one("#error", Static)
        try:
            options = self.options()
            spec = build_spec(options)
        except GpuwsError as exc:
            error.update(Text.assemble(("✗ ", "bold"), exc.message,
                                       (f" — {exc.remedy}" if exc.remedy else "")))
            # The form is taller than most terminals: bring the refusal into view.
            self.call_after_refresh(error.scroll_visible, animate=False)
            return
        error.update("")
        self._remember()
        baseline = _choice(self, "#baseline")

        def launch(yes: bool | None = True) -> None:
            if yes:
                self.app.launch_run(spec, baseline, options.workspace)

        if self.kind != "cmd" and self._no_gpu_note().plain:
            # Known before the run: the probe found no GPU, and this workload needs one.
            self.app.push_screen(ConfirmScreen(
                "This pod has no GPU: launch anyway?",
                Text(f"{self._no_gpu_note().plain[2:]}\n\nThe run would stop at once with "
                     "\"No GPU on the pod\"; nothing would be measured."), "Launch anyway"),
                launch)
            return
        launch()

    def action_watch(self) -> None:
        """Start the watch loop with this form: a run on every save
        (``gpuws watch``)."""
        from ...live.watchloop import watched_paths

        error = self.query_one("#error", Static)
        try:
            options = self.options()
            self._check_watchable(options)  # first: the spec's own errors speak of `file:`
            build_spec(options)
            watched_paths(options.workspace, options.workload)
        except GpuwsError as exc:
            error.update(Text.assemble(("✗ ", "bold"), exc.message,
                                       (f" — {exc.remedy}" if exc.remedy else "")))
            self.call_after_refresh(error.scroll_visible, animate=False)
            return
        error.update("")
        self._remember()
        baseline = _choice(self, "#baseline")

        def watch(yes: bool | None = True) -> None:
            if yes:
                self.app.start_watch(options, baseline)

        if self.kind == "cmd":
            # Asked once here, as Launch asks before a GPU run on a pod without one: a
            # command has no Tier 1, so each save would add a row with no median.
            self.app.push_screen(ConfirmScreen(
                "A command has no Tier 1: watch it anyway?",
                Text("Watch compares each version's Tier-1 median (CUDA events around a "
                     "Python file's run()) with the last one and the baseline. A command "
                     "has none: every save would re-run it and add a row with nothing to "
                     "compare.\n\nChoose \"Python file\" to compare versions, or watch "
                     "anyway to re-run the command on every save."), "Watch anyway"),
                watch)
            return
        watch()

    def _check_watchable(self, options: LaunchOptions) -> None:
        """Refuse, in the form's words, a watch that has nothing to watch or that would
        fail the same way on every save (``live.watchloop.watched_paths`` speaks the CLI's
        ``-W``/``-w``, which this form does not show).

        Raises:
            UsageError: nothing to watch, a missing folder or file, or no GPU for a
                workload that needs one.
        """
        kinds = {"builtin": "a bundled kernel", "cmd": "a command"}
        if options.workspace:
            if not Path(options.workspace).expanduser().is_dir():
                raise UsageError(f"project dir {options.workspace!r} is not a folder here",
                                 remedy="type your project's folder under Workspace, or "
                                        "empty it to watch the Python file alone")
        elif self.kind == "file":
            path = options.workload.removeprefix("file:")
            if not Path(path).expanduser().is_file():
                raise UsageError(f"Python file {path!r}: no such file here",
                                 remedy="type the path of your benchmark on this machine")
        else:
            raise UsageError(f"Watch has nothing to watch for {kinds[self.kind]}",
                             remedy="fill in \"project dir\" under Workspace with your "
                                    "project's folder, or choose \"Python file\"")
        why = self._no_gpu_why()
        if self.kind != "cmd" and why is not None:
            # Launch asks, because one run shows the failure once; a watch would repeat
            # the same failure on every save, so it is refused before it starts.
            raise UsageError(f"This pod has no GPU ({why}): every save's run would fail "
                             "at once, the same way",
                             remedy="connect to a pod with a GPU, or watch a command")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "launch":
            self.action_launch()
        elif event.button.id == "watch":
            self.action_watch()
        else:
            self.action_back()


_T1_LABEL = "1 CUDA events"
#: Where each workload kind is filled in.
_KIND_FIELD = {"builtin": "#builtin", "file": "#file", "cmd": "#cmd"}


def _row(label: str, widget: Input | Select[str]) -> ComposeResult:
    widget.compact = True
    with Horizontal(classes="row"):
        yield Label(label)
        yield widget


def _number(screen: Screen[None], selector: str, what: str) -> float:
    text = screen.query_one(selector, Input).value.strip()
    try:
        return float(text)
    except ValueError as exc:
        raise UsageError(f"{what} must be a number, not {text!r}") from exc


def _optional_number(screen: Screen[None], selector: str, what: str) -> float | None:
    """An empty field is None (no value), anything else must be a number."""
    if not screen.query_one(selector, Input).value.strip():
        return None
    return _number(screen, selector, what)


def _choice(screen: Screen[None], selector: str) -> str | None:
    select: Select[str] = screen.query_one(selector, Select)
    return None if select.is_blank() else str(select.value)
