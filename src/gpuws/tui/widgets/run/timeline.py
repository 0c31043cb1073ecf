"""The run's timeline: streams and ranks as rows across time, kernels coloured by family.

:class:`TimelinePane` holds a :class:`TimelineView` (the rows, focusable, with its keys in
the footer) and the selected block's details under it: its name, duration, where it ran,
and its row of Tier 2's kernel table (calls, share, the Python line that launched it).
The view draws a :class:`gpuws.live.timeline.Timeline` a column at a time
(:func:`gpuws.live.timeline.columns`): a redraw costs the columns and at most
``MAX_WALK`` events, never the whole trace. Every name is the pod's: shown through
``visible`` as Text, never markup.
"""

from __future__ import annotations

import math
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from .... import protocol
from ....errors import GpuwsError
from ....live import timeline as tl
from ....live import verdicts
from ....sessions.store import ArtifactRow
from ....text.textsafe import visible
from ....timeline.families import FAMILY_COLOURS
from ... import fmt
from ..quiet import QuietStatic

#: One colour per family (tl.FAMILIES order), the export's own (Okabe-Ito); the selected
#: block's family is also said in words under the rows.
COLOURS = tuple(FAMILY_COLOURS[f] for f in tl.FAMILIES)
#: Eighths of a cell, for bars whose height is the share of the column's time the stream
#: was busy (a row may be several cells tall).
_EIGHTHS = " ▁▂▃▄▅▆▇█"
#: Most screen rows one stream gets (more rows: finer busy shares).
MAX_ROW_HEIGHT = 4
#: The legend's words where the screen is narrow.
_SHORT = {"communication": "comm", "attention": "attn", "copy/memset": "copy",
          "normalisation": "norm", "reduction": "reduce", "elementwise": "elem"}
#: The narrowest view (µs): a few ns a column at 160 columns.
MIN_SPAN_US = 1.0
ZOOM = 2.0


def _us(value: float) -> str:
    """A time in µs in the unit that reads best."""
    return fmt.ms(value / 1000.0)


def _nice_step(span: float, ticks: int) -> float:
    """A round tick spacing (1, 2 or 5 × 10^k µs) giving at most ``ticks`` ticks."""
    raw = span / max(1, ticks)
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 5, 10):
        if m * base >= raw:
            return m * base
    return 10 * base


class TimelineView(Widget, can_focus=True):
    """The rows of a timeline; the keys move the view and the selected block."""

    _BLOCK = Binding.Group("block")
    _ZOOM = Binding.Group("zoom", compact=True)
    _PAN = Binding.Group("pan", compact=True)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "block(-1)", "previous block", group=_BLOCK),
        Binding("right", "block(1)", "next block", group=_BLOCK),
        Binding("up", "track(-1)", "row above", show=False),
        Binding("down", "track(1)", "row below", show=False),
        Binding("plus,equals_sign", "zoom_in", "zoom in", group=_ZOOM),
        Binding("minus", "zoom_out", "zoom out", group=_ZOOM),
        Binding("h", "pan(-1)", "pan back", group=_PAN),
        Binding("l", "pan(1)", "pan on", group=_PAN),
        Binding("g", "next_gap", "next gap"),
        Binding("n", "next_instance", "next launch"),
        Binding("0", "fit", "whole run"),
    ]
    DEFAULT_CSS = """
    TimelineView { height: 1fr; min-height: 5; }
    TimelineView:focus { background-tint: $foreground 3%; }
    """

    #: The visible time range (µs from the timeline's origin).
    lo: reactive[float] = reactive(0.0)
    hi: reactive[float] = reactive(1.0)
    #: The selected track, and its selected event (None: none).
    track: reactive[int] = reactive(0)
    index: reactive[int | None] = reactive(None)

    class Changed(Message):
        """The selection moved, or a key had something to say (``status``)."""

        def __init__(self, view: TimelineView, status: str = "") -> None:
            self.view = view
            self.status = status
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.timeline: tl.Timeline | None = None
        self._top = 0
        self._stride = 1

    # ------------------------------------------------------------------ data
    def show(self, timeline: tl.Timeline, first: str | None = None) -> None:
        """Draw ``timeline`` whole, selecting the first launch of the kernel named
        ``first`` (Tier 2's top one), else the first block."""
        self.timeline = timeline
        self._top = 0
        self.lo, self.hi = 0.0, max(timeline.end, MIN_SPAN_US)
        self.track = 0
        self.index = 0 if timeline.tracks and len(timeline.tracks[0]) else None
        name = timeline.names.index(first) if first in timeline.names else None
        if name is not None:
            launches = [(tr.starts[tr.instances(name)[0]], k, tr.instances(name)[0])
                        for k, tr in enumerate(timeline.tracks) if tr.instances(name)]
            _, self.track, self.index = min(launches)
        self._changed()

    @property
    def selected(self) -> tuple[tl.Track, int] | None:
        """The selected track and event index, if a block is selected."""
        t = self.timeline
        if t is None or not t.tracks or self.index is None:
            return None
        return t.tracks[self.track], self.index

    def _changed(self, status: str = "") -> None:
        self.post_message(self.Changed(self, status))
        self.refresh()

    # ------------------------------------------------------------------ geometry
    @property
    def _label_width(self) -> int:
        return 12 if self.size.width < 100 else 18

    @property
    def _cols(self) -> int:
        return max(1, self.size.width - self._label_width - 1)

    @property
    def _header_rows(self) -> int:
        return 3 if self.timeline is not None and self.timeline.window is not None else 2

    @property
    def _track_rows(self) -> int:
        return max(1, self.size.height - self._header_rows - 1)

    @property
    def _row_height(self) -> int:
        n = len(self.timeline.tracks) if self.timeline is not None else 1
        return max(1, min(MAX_ROW_HEIGHT, self._track_rows // max(1, n)))

    @property
    def _tracks_shown(self) -> int:
        return max(1, self._track_rows // self._row_height)

    def _set_view(self, lo: float, span: float) -> None:
        end = self.timeline.end if self.timeline is not None else 1.0
        span = min(max(span, MIN_SPAN_US), max(end, MIN_SPAN_US))
        lo = min(max(lo, 0.0), max(0.0, end - span))
        self.lo, self.hi = lo, lo + span

    def _show_block(self, track: tl.Track, i: int) -> None:
        """Pan so the block is in view (centred when it was not)."""
        s, e = track.starts[i], track.ends[i]
        if s >= self.lo and e <= self.hi:
            return
        span = self.hi - self.lo
        self._set_view((s + e) / 2 - span / 2 if e - s < span else s, span)

    # ------------------------------------------------------------------ actions
    def action_block(self, step: int) -> None:
        """Select the previous (-1) or next (1) block on the row."""
        t = self.timeline
        if t is None or not t.tracks:
            return
        track = t.tracks[self.track]
        if not len(track):
            return
        if self.index is None:
            first = track.at(self.lo)
            i = first if first is not None else len(track) - 1
        else:
            i = min(max(self.index + step, 0), len(track) - 1)
        self.index = i
        self._show_block(track, i)
        self._changed()

    def action_track(self, step: int) -> None:
        """Select the row above (-1) or below (1), at the same time."""
        t = self.timeline
        if t is None or not t.tracks:
            return
        here = self.selected
        when = here[0].starts[here[1]] if here is not None else self.lo
        self.track = min(max(self.track + step, 0), len(t.tracks) - 1)
        track = t.tracks[self.track]
        self.index = track.at(when) if len(track) else None
        if self.index is None and len(track):
            self.index = len(track) - 1
        self._changed()

    def _centre(self) -> float:
        here = self.selected
        if here is not None:
            track, i = here
            mid = (track.starts[i] + track.ends[i]) / 2
            if self.lo <= mid <= self.hi:
                return mid
        return (self.lo + self.hi) / 2

    def action_zoom_in(self) -> None:
        """Show half the time, around the selected block."""
        self._zoom(1 / ZOOM)

    def action_zoom_out(self) -> None:
        """Show twice the time."""
        self._zoom(ZOOM)

    def _zoom(self, factor: float) -> None:
        c, span = self._centre(), (self.hi - self.lo) * factor
        self._set_view(c - span / 2, span)
        self._changed()

    def action_pan(self, step: int) -> None:
        """Move the view a quarter of its width back (-1) or on (1)."""
        span = self.hi - self.lo
        self._set_view(self.lo + step * span / 4, span)
        self._changed()

    def action_fit(self) -> None:
        """Show the whole run."""
        if self.timeline is not None:
            self._set_view(0.0, self.timeline.end)
            self._changed()

    def action_next_gap(self) -> None:
        """Jump to the next idle gap of the selected row's rank, selecting the block after."""
        t = self.timeline
        if t is None or not t.tracks:
            return
        track = t.tracks[self.track]
        here = self.selected
        after = here[0].ends[here[1]] if here is not None else self.lo
        gap = t.next_gap(track.rank, after)
        if gap is None:
            self._changed(f"no idle gap of {_us(tl.GAP_MIN_US)} or more after this point on "
                          f"{visible(track.rank, 64)}")
            return
        lo, hi = gap
        # The gap a quarter of the view, in its middle: what lies either side shows too.
        span = 4 * (hi - lo)
        self._set_view((lo + hi) / 2 - span / 2, span)
        self.index = track.at(hi)
        self._changed(f"idle gap of {_us(hi - lo)} at {_us(lo)}")

    def action_next_instance(self) -> None:
        """Select the next launch of the selected kernel on this row."""
        here = self.selected
        if here is None or self.timeline is None:
            return
        track, i = here
        same = track.instances(track.names[i])
        k = same.index(i)
        if k + 1 >= len(same):
            self._changed(f"the last of its {len(same)} launches on this row")
            return
        self.index = same[k + 1]
        self._show_block(track, self.index)
        self._changed()

    def on_click(self, event: events.Click) -> None:
        """Select the block under the pointer (or the next one after it on that row)."""
        t = self.timeline
        row = event.y - self._header_rows
        if t is None or not 0 <= row < self._track_rows or event.x <= self._label_width:
            return
        k = self._top + row // self._row_height
        if k >= len(t.tracks):
            return
        col = event.x - self._label_width - 1
        when = self.lo + (col + 0.5) * (self.hi - self.lo) / self._cols
        self.track = k
        self.index = t.tracks[k].at(when)
        self.focus()
        self._changed()

    # ------------------------------------------------------------------ drawing
    def render(self) -> Text:
        t = self.timeline
        if t is None:
            return Text("")
        cols, lw = self._cols, self._label_width
        span = self.hi - self.lo
        dt = span / cols
        lines: list[Text] = []
        head = Text()
        head.append(f"{_us(self.lo)} – {_us(self.hi)}", "bold")
        head.append(f" of {_us(t.end)} · ×{t.end / span:.3g} · 1 column = {_us(dt)}", "dim")
        lines.append(head)
        lines.append(self._axis(lw, cols, dt))
        if t.window is not None:
            # The selected row's rank's window (each rank judged its own steps).
            rank = t.tracks[self.track].rank if t.tracks else ""
            lines.append(self._window_row(t.windows.get(rank, t.window), lw, cols, dt))
        # The selected row stays in sight; the first row shown follows it (made here,
        # where the widget's size is the one drawn, not when a key moved the selection).
        shown = self._tracks_shown
        self._top = min(max(self._top, self.track - shown + 1), self.track,
                        max(0, len(t.tracks) - shown))
        self._top = max(0, self._top)
        rows = t.tracks[self._top:self._top + shown]
        self._stride = 1
        for k, track in enumerate(rows, start=self._top):
            lines.extend(self._row(t, k, track, lw, cols, dt))
        if self._stride > 1:
            head.append(f" · 1 event in {self._stride} drawn", "yellow")
        lines.append(self._legend())
        return Text("\n").join(lines)

    def _axis(self, lw: int, cols: int, dt: float) -> Text:
        line = [" "] * cols
        step = _nice_step(cols * dt, max(1, cols // 14))
        first = math.ceil(self.lo / step) * step
        tick = first
        while tick < self.hi:
            c = int((tick - self.lo) / dt)
            label = "╵" + _us(tick)
            free = all(ch == " " for ch in line[max(0, c - 1):c + len(label)])
            if c + len(label) <= cols and free:
                line[c:c + len(label)] = list(label)
            tick += step
        return Text(" " * (lw + 1) + "".join(line), "dim")

    def _window_row(self, window: tuple[float, float, str], lw: int, cols: int,
                    dt: float) -> Text:
        lo, hi, name = window
        text = Text("judged".ljust(lw)[:lw] + " ", "bold")
        c0 = max(0, int((lo - self.lo) / dt))
        c1 = min(cols, math.ceil((hi - self.lo) / dt))
        cells = ["━" if c0 <= c < c1 else " " for c in range(cols)]
        # The window's own words ride on the line where they fit (pod text: visible).
        words = visible(name, 200)
        fits = c1 - c0 > len(words) + 2 and cell_len(words) == len(words)
        if fits:
            cells[c0 + 1:c0 + 1 + len(words)] = list(words)
        text.append("".join(cells), "magenta")
        if fits:
            text.stylize("bold", lw + 2 + c0, lw + 2 + c0 + len(words))
        return text

    def _row(self, t: tl.Timeline, k: int, track: tl.Track, lw: int, cols: int,
             dt: float) -> list[Text]:
        """One stream: ``_row_height`` lines of bars, the label on the top one."""
        height = self._row_height
        short = f"{track.rank.replace('rank ', 'r')} {track.stream.replace('stream ', 's')}"
        label = visible(track.label if lw >= 18 else short, 200)
        if len(label) > lw:
            label = label[:lw - 1] + "…"
        label_style = "reverse bold" if k == self.track else "bold"
        lines = [Text(label.ljust(lw) if r == 0 else " " * lw, label_style) + Text(" ")
                 for r in range(height)]
        got = tl.columns(track, self.lo, self.hi, cols)
        self._stride = max(self._stride, got.stride)
        sel_c0 = sel_c1 = -1
        if k == self.track and self.index is not None:
            s, e = track.starts[self.index], track.ends[self.index]
            if e >= self.lo and s <= self.hi:
                sel_c0 = max(0, min(cols - 1, int((s - self.lo) / dt)))
                sel_c1 = max(sel_c0, min(cols - 1, int((e - self.lo) / dt)))
        gaps = t.gaps.get(track.rank, [])
        for c in range(cols):
            busy, fam = got.busy[c], got.family[c]
            chosen = sel_c0 <= c <= sel_c1
            if fam < 0:
                idle = "·" if _in_gap(gaps, self.lo + (c + 0.5) * dt) else " "
                for r in range(height):
                    glyph = idle if r == height - 1 else " "
                    lines[r].append(glyph, "reverse" if chosen else "dim")
                continue
            # At least one eighth: a busy column never reads as idle.
            eighths = max(1, round(busy * 8 * height))
            style = COLOURS[fam] + (" reverse" if chosen else "")
            for r in range(height):
                fill = min(8, max(0, eighths - 8 * (height - 1 - r)))
                lines[r].append(_EIGHTHS[fill], style)
        return lines

    def _legend(self) -> Text:
        text = Text()
        narrow = self.size.width < 120
        for name, colour in zip(tl.FAMILIES, COLOURS, strict=True):
            text.append("█", colour)
            text.append(f"{_SHORT.get(name, name) if narrow else name} ")
        text.append("· idle gap" if narrow else "· idle gap · bar height: busy share", "dim")
        return text


def _in_gap(gaps: list[tuple[float, float]], t: float) -> bool:
    import bisect

    i = bisect.bisect_right(gaps, (t, math.inf)) - 1
    return i >= 0 and gaps[i][0] <= t <= gaps[i][1]


class TimelinePane(Vertical):
    """The timeline and, under it, the selected block and its kernel-table row."""

    DEFAULT_CSS = """
    TimelinePane { height: 1fr; }
    TimelinePane #timeline-note { height: auto; padding: 0 1; color: $text-muted; }
    TimelinePane #timeline-detail { height: auto; max-height: 6; padding: 0 1; }
    """

    class Read(Message):
        """The trace was read: its timeline, or why there is none."""

        def __init__(self, timeline: tl.Timeline | None, error: str) -> None:
            self.timeline = timeline
            self.error = error
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.rows: dict[str, protocol.KernelRow] = {}
        self._table: protocol.KernelTable | None = None
        #: The trace file shown (or being read), so a second ask for it reads nothing.
        self.path: str | None = None

    def compose(self) -> ComposeResult:
        yield QuietStatic("", id="timeline-note")
        yield TimelineView(id="timeline-view")
        yield QuietStatic("", id="timeline-detail")

    def on_mount(self) -> None:
        self.query_one(TimelineView).display = False

    def say(self, why: str, style: str = "dim") -> None:
        """No timeline to draw: say why (plain text, the pod's words made visible)."""
        self.query_one(TimelineView).display = False
        self.query_one("#timeline-detail", QuietStatic).update(Text(""))
        self.query_one("#timeline-note", QuietStatic).update(Text(visible(why, 600), style))

    def show_trace(self, row: ArtifactRow | None, table: protocol.KernelTable | None,
                   none_why: str) -> None:
        """Draw the run's trace artifact once it is home; else say why there is none.

        Args:
            row: the trace's artifact row (None: the run kept no trace).
            table: Tier 2's kernel table (each block's row comes from it).
            none_why: what to say when the run kept no trace.
        """
        if row is None:
            self.say(none_why)
        elif row.status == "pulled" and row.local_path:
            self.load(row.local_path, table)
        elif row.status == "remote":
            self.say(f"The timeline trace is still on the pod: f opens the artifacts, or "
                     f"`gpuws pull {row.run_id}` brings it home.")
        else:
            self.say(f"The timeline trace did not come home whole ({row.status}): pull it "
                     f"again (`gpuws pull {row.run_id}`).", "yellow")

    def load(self, path: str, table: protocol.KernelTable | None) -> None:
        """Read the pulled trace at ``path`` off the event loop, then draw it."""
        if path == self.path:
            return
        self.path = path
        self._table = table
        self.say("reading the run's timeline trace…")
        self._read(path)

    @work(thread=True, exclusive=True, group="timeline", exit_on_error=False,
          description="read the timeline trace")
    def _read(self, path: str) -> None:
        # A thread: parsing 10^6 events takes seconds of CPU the event loop must not wait
        # on. Only a new Timeline crosses back, in a message; nothing shared is mutated.
        try:
            got = tl.load(path)
        except GpuwsError as exc:
            self.post_message(self.Read(None, exc.one_line()))
            return
        self.post_message(self.Read(got, ""))

    def on_timeline_pane_read(self, message: Read) -> None:
        message.stop()
        if message.timeline is None:
            self.path = None  # a pull that replaces the file is read again
            self.say(message.error, "red")
        else:
            self.show(message.timeline, self._table)

    def show(self, timeline: tl.Timeline, table: protocol.KernelTable | None) -> None:
        """Draw ``timeline``; ``table`` (Tier 2's kernel rows) gives each block its row."""
        self.rows = {r.name: r for r in table.kernels} if table is not None else {}
        view = self.query_one(TimelineView)
        view.display = True
        note = (f"{timeline.events} GPU events · {len(timeline.tracks)} stream(s)"
                + (f" · {len(timeline.phases)} one-time phase(s) left out of the judged window"
                   if timeline.phases else "")
                + (f" · clipped: {timeline.note}" if timeline.note else ""))
        self.query_one("#timeline-note", QuietStatic).update(Text(visible(note, 600), "dim"))
        if not timeline.tracks:
            self.say("the trace holds no GPU event (kernel, memcpy or memset)")
            return
        # Tier 2's top kernel selected first: its row (share, code) is what matters.
        view.show(timeline, table.kernels[0].name if table is not None and table.kernels
                  else None)

    def on_timeline_view_changed(self, message: TimelineView.Changed) -> None:
        message.stop()
        self.query_one("#timeline-detail", QuietStatic).update(
            self.describe(message.view, message.status))

    def describe(self, view: TimelineView, status: str = "") -> Text:
        """The selected block: name, family, duration, place; its Tier 2 row."""
        text = Text()
        if status:
            text.append(status + "\n", "yellow")
        here = view.selected
        t = view.timeline
        if here is None or t is None:
            text.append("no block selected: ← → select one", "dim")
            return text
        track, i = here
        name = t.names[track.names[i]]
        fam = tl.FAMILIES[track.fams[i]]
        same = track.instances(track.names[i])
        text.append("▸ ", COLOURS[track.fams[i]])
        text.append(visible(verdicts.short(name), 300), "bold")
        text.append(f"\n  {fam} · {_us(track.ends[i] - track.starts[i])} at "
                    f"{_us(track.starts[i])} · {visible(track.label, 200)} · launch "
                    f"{same.index(i) + 1} of {len(same)} on this row")
        row = self.rows.get(name)
        if row is not None:
            text.append(f"\n  Tier 2: {row.calls} calls · mean {fmt.ms(row.mean_ns / 1e6)} · "
                        f"{fmt.pct(row.share_pct)} of kernel time")
            if row.code:
                text.append(" · launched from ")
                text.append(visible(row.code, 300), "cyan")
        elif self.rows:
            text.append("\n  not in Tier 2's kernel table (outside the judged window, or "
                        "a memcpy/memset)", "dim")
        if verdicts.short(name) != name:
            text.append("\n  " + visible(name, 600), "dim")
        return text
