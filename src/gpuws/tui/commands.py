"""The command palette (``Ctrl+P``): gpuws's own actions by name, then the screen's keys.

gpuws's commands (connect, new run, replay, export, sessions, compare, attach, cancel)
are offered on every screen, so typing "replay" or "compare" finds them wherever the
palette is opened; one that cannot run yet (a new run with no pod) still runs and says
what is missing, which teaches more than a command that is not there. After them come
the current screen's bound actions (the same ones the footer shows), so anything a key
does can also be found by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from .screens.run import RunScreen

if TYPE_CHECKING:
    from .app import GpuwsApp


@dataclass(frozen=True)
class Command:
    """One palette entry.

    Attributes:
        name: what the palette shows and matches what is typed against.
        help: the line under it.
        run: what choosing it does.
    """

    name: str
    help: str
    run: Callable[[], Any]


#: Bound actions that a gpuws command already offers by name (listed once, not twice).
_COVERED = frozenset({"app.new_run", "new_run", "app.open_sessions", "open_sessions",
                      "app.export", "export", "app.attach_run", "attach_run", "cancel",
                      "app.reconnect", "reconnect"})


def gpuws_commands(app: GpuwsApp, screen: Any) -> list[Command]:
    """gpuws's own actions as the palette offers them on ``screen``.

    Args:
        app: the app (its public methods do the work).
        screen: the screen the palette was opened on (a run's screen lends its run).
    """
    pod = "" if app.can_reach_pod() else " (connect to a pod first)"
    run_id: str | None = getattr(screen, "run_id", None) or app.last_run_id
    commands = [
        Command("Connect to a pod",
                "Home: pick a host from your ssh config or type user@host[:port]",
                app.go_home),
        Command("New run", f"choose a workload and tiers and start it on the pod{pod}",
                app.action_new_run),
        Command("Replay a recorded run",
                "pick a session, then a run, and play it through the live panes",
                app.action_open_sessions),
    ]
    if run_id is not None:
        commands.append(Command(f"Replay run {run_id}", "its panes again, read from the store",
                                partial(app.replay_stored_run, run_id)))
    commands += [
        Command("Export the session as markdown",
                "write the current session as a report to paste into a PR", app.action_export),
        Command("Sessions", "every recorded session: its runs, replay, export",
                app.action_open_sessions),
        Command("Compare with the baseline",
                "the run's speedup against its baseline, with a 95% CI and metric deltas"
                + ("" if run_id else " (no run yet)"),
                partial(_compare, app, run_id)),
        Command("Attach to a run on the pod",
                f"pick one of the pod's runs and follow it{pod}", app.action_attach_run),
        Command("Cancel the run",
                (f"kill run {run_id}'s process group on the pod" if run_id else
                 "kill a run's process group on the pod (no run yet)") + pod,
                partial(_cancel, app, screen, run_id)),
    ]
    return commands


def _compare(app: GpuwsApp, run_id: str | None) -> None:
    if run_id is None:
        app.notify("no run yet: start one (New run) or open one from Sessions",
                   severity="warning", markup=False)
        return
    # Imported here: the results screen pulls in the widgets, the palette need not.
    from .screens.results import ResultsScreen

    app.push_screen(ResultsScreen(run_id, tab="tab-compare"))


def _cancel(app: GpuwsApp, screen: Any, run_id: str | None) -> None:
    if run_id is None:
        app.notify("no run to cancel", severity="warning", markup=False)
    elif not app.can_reach_pod():
        app.notify("connect to the pod first: cancelling happens there", severity="warning",
                   markup=False)
    elif isinstance(screen, RunScreen) and not screen.check_action("cancel", ()):
        app.notify(f"run {run_id} has finished: nothing to cancel", severity="warning",
                   markup=False)
    else:
        app.cancel_run(run_id)


class ActionsProvider(Provider):
    """gpuws's commands, then the current screen's bound actions, by their names."""

    def _commands(self) -> list[Command]:
        app = cast("GpuwsApp", self.app)
        out = gpuws_commands(app, self.screen)
        seen: set[str] = set(_COVERED)
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.description or not active.enabled or binding.action in seen:
                continue
            if binding.action in ("quit", "app.quit", "command_palette"):
                continue  # the system commands already offer these
            seen.add(binding.action)
            keys = self.app.get_key_display(binding) or key
            out.append(Command(binding.description, f"key: {keys}",
                               partial(self.app.run_action, binding.action, active.node)))
        return out

    async def discover(self) -> Hits:
        for command in self._commands():
            yield DiscoveryHit(command.name, command.run, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in self._commands():
            score = matcher.match(command.name)
            if score > 0:
                yield Hit(score, matcher.highlight(command.name), command.run,
                          text=command.name, help=command.help)
