"""The watch screen shown hostile text: no crash, no escape on the screen, markup as text.

What the watch screen draws that is not the laptop's own: an iteration's status and error
(the pod's ``run_finished``), the changed files' names and the workload's path (any bytes
a file name may hold on this machine; a project cloned from a stranger chose them). A pod
whose ``run_finished`` carries every hostile piece of ``hostile_text.py`` cannot exist
here (the local agent writes its own error texts), so the iterations are handed to the
screen's update methods as the loop would hand them.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable

from gpuws.live.watchloop import Iteration, WatchStatus
from gpuws.tui.screens.watch import WatchScreen
from security.hostile_text import HOSTILE, unsafe_chars  # type: ignore[import-not-found]
from tui.tuikit import frozen_app, settle  # type: ignore[import-not-found]


async def test_the_watch_screen_shows_hostile_text_as_text() -> None:
    app = frozen_app()
    async with app.run_test(size=(160, 50)) as pilot:
        screen = WatchScreen(f"file:{HOSTILE}.py", [Path(f"/home/me/{HOSTILE}")])
        await app.push_screen(screen)
        await settle(pilot, lambda: screen.is_mounted)
        ok = Iteration(1, [], run_id="20261125-021500-5e1a7c01", status="ok",
                       samples=[0.2, 0.2], median_ms=0.2, ci_pct=0.5, ci_low_ms=0.199,
                       ci_high_ms=0.201)
        screen.show_iteration(ok, 1, 0.2)
        for n, (status, error) in enumerate(((HOSTILE, HOSTILE), ("failed", HOSTILE)), 2):
            screen.show_iteration(Iteration(n, [HOSTILE, f"b/{HOSTILE}"],
                                            run_id=f"20261125-02160{n}-5e1a7c0{n}",
                                            status=status, error=error), 1, 0.2)
            # The failed iteration's whole error is in the line under the table.
            screen.query_one("#iterations", DataTable).move_cursor(row=n - 1)
            screen.show_status(WatchStatus("waiting", n, 3))
            await settle(pilot, lambda n=n: screen.query_one("#iterations").row_count == n)
            drawn = app.export_screenshot()
            assert unsafe_chars(drawn) == []
            assert unsafe_chars(screen.title or "") == unsafe_chars(screen.sub_title or "") == []
            # Shown, as characters: the escape and the markup, never obeyed.
            assert "\\e]0;pwned" in drawn
            assert "[link=http://evil.example/]click[/link]" in str(
                screen.query_one("#watch-detail").render())
        assert app.return_code is None  # nothing crashed, nothing quit ([@click=app.quit])
