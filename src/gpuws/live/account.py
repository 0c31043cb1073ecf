"""Every event of a run stored or accounted for: the output cap, and seqs that never came.

Two things a person must be told rather than find out:

- **The output cap.** A workload printing at full speed (``yes``) made 1.39 M events in
  15 s; stored, they are hundreds of MB and minutes of work for the laptop. Each run's
  stored output is capped (``max_output_mib`` in the config, :data:`DEFAULT_MAX_OUTPUT_MIB`
  by default): the ``output`` event that would pass the cap is stored as a ``log`` line
  saying so and where the rest is (the run's ``events.ndjson`` on the pod, which keeps
  everything), and later ``output`` events are counted, not stored. Every other event
  (tier results, artifacts, ``run_finished``) is still stored. When the run ends, one
  notice says how many events and bytes were counted past the cap.
- **Seqs that never came.** The pod numbers a run's events without gaps; a jump means
  lines the pod could not send whole (a line over the size limit, or not a protocol
  event: a workload can write into its own run's ``events.ndjson``). The person is told
  which seqs, once, and why.

:class:`RunAccount` sits between the trust boundary and the store
(:meth:`gpuws.live.engine.Engine._on_wire`), so it sees checked events only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from .. import protocol
from ..text import humanfmt

#: Stored output per run, by default, in MiB (``max_output_mib`` in the config).
DEFAULT_MAX_OUTPUT_MIB = 64.0
#: How the stored stand-in for the first output past the cap begins.
TRUNCATED_PREFIX = "output truncated at "

_encoder = msgspec.json.Encoder()

#: Told (run_id, kind, message) of what a person must know about a run's events; kind is
#: ``missing`` (seqs that never came) or ``truncated`` (what the output cap counted).
OnAccount = Callable[[str, str, str], None]


@dataclass
class _Run:
    stored_bytes: int = 0
    run_dir: str | None = None
    #: The seq whose output was replaced by the truncation notice, once the cap is hit.
    truncated_at: int | None = None
    #: That notice (a resend of its seq gets it again, byte for byte).
    notice: protocol.Log | None = None
    counted: int = 0
    counted_bytes: int = 0
    #: The highest seq seen (resends at or below it are neither counted nor reported).
    last_seq: int = -1
    told_end: bool = False


class RunAccount:
    """Caps each run's stored output and names the seqs that never arrived.

    Args:
        max_output_bytes: stored output per run (encoded events, as the store keeps them).
        on_account: told of the seqs that never came and, at a run's end, of what the
            cap counted; each once.
    """

    def __init__(self, max_output_bytes: int, on_account: OnAccount) -> None:
        self.max_output_bytes = max_output_bytes
        self.on_account = on_account
        self._runs: dict[str, _Run] = {}

    def resume(self, run_id: str, stored: list[protocol.Events], from_seq: int) -> None:
        """Carry on from what the store holds of a run, the pod sending from ``from_seq``."""
        run = self._runs.setdefault(run_id, _Run())
        run.last_seq = max(run.last_seq, from_seq - 1)
        for ev in stored:
            if ev.seq is not None:
                run.last_seq = max(run.last_seq, ev.seq)
            if isinstance(ev, protocol.RunStarted):
                run.run_dir = run.run_dir or ev.run_dir
            elif isinstance(ev, protocol.Output):
                run.stored_bytes += len(_encoder.encode(ev))
            elif (isinstance(ev, protocol.Log) and ev.message.startswith(TRUNCATED_PREFIX)
                    and run.truncated_at is None):
                # The output the notice stands in for was past the cap too; the ones after
                # it come again (the stored sequence has a gap there) and are counted then.
                run.truncated_at, run.notice, run.counted = ev.seq, ev, 1

    def check(self, ev: protocol.Events) -> protocol.Events | None:
        """The event to store (``ev``, or the truncation notice in its place), or None
        for output past the cap (counted)."""
        run_id, seq = ev.run_id, ev.seq
        if run_id is None or seq is None:
            return ev
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        new = seq > run.last_seq
        if new:
            if seq > run.last_seq + 1:
                self._missing(run_id, run, run.last_seq + 1, seq - 1)
            run.last_seq = seq
        if isinstance(ev, protocol.RunStarted):
            run.run_dir = run.run_dir or ev.run_dir
        elif isinstance(ev, protocol.Output):
            return self._output(run_id, run, ev, new)
        elif isinstance(ev, protocol.RunFinished) and run.counted and not run.told_end:
            run.told_end = True
            self.on_account(run_id, "truncated", (
                f"run {run_id}: {run.counted:,} output event(s) "
                f"({humanfmt.size(run.counted_bytes)}) past the "
                f"{humanfmt.size(self.max_output_bytes)} output cap were counted, not "
                f"stored; all of them are in {self._log_path(run)}"))
        return ev

    def _output(self, run_id: str, run: _Run, ev: protocol.Output,
                new: bool) -> protocol.Events | None:
        seq = ev.seq
        assert seq is not None
        if run.truncated_at is not None and seq >= run.truncated_at:
            if seq == run.truncated_at:
                return self._notice(run_id, run, ev)  # resent: the same stand-in again
            if new:
                run.counted += 1
                run.counted_bytes += len(_encoder.encode(ev))
            return None
        if not new:
            return ev  # a resend of stored output: the store ignores it
        size = len(_encoder.encode(ev))
        if run.stored_bytes + size <= self.max_output_bytes:
            run.stored_bytes += size
            return ev
        run.truncated_at = seq
        run.counted += 1
        run.counted_bytes += size
        return self._notice(run_id, run, ev)

    def _notice(self, run_id: str, run: _Run, ev: protocol.Output) -> protocol.Log:
        # Made once per run and given again to a resend of its seq (also after an attach
        # with another cap), so the store takes the resend as the same event.
        if run.notice is None:
            message = (f"{TRUNCATED_PREFIX}{humanfmt.size(self.max_output_bytes)} "
                       f"(max_output_mib in the config): this run's later output is counted, "
                       f"not stored; the rest is on the pod at {self._log_path(run)}")
            run.notice = protocol.Log(run_id=run_id, seq=ev.seq, ts=ev.ts, level="warning",
                                      message=message)
        return run.notice

    def _missing(self, run_id: str, run: _Run, first: int, last: int) -> None:
        seqs = f"event {first:,}" if first == last else f"events {first:,}–{last:,}"
        self.on_account(run_id, "missing", (
            f"run {run_id}: {seqs} never arrived: the pod could not send them whole (a line "
            f"over the size limit or not a protocol event, as when a workload writes into "
            f"its own run's events.ndjson); what was written is in {self._log_path(run)}"))

    @staticmethod
    def _log_path(run: _Run) -> str:
        if run.run_dir is None:
            return "the run's events.ndjson on the pod"
        return f"{run.run_dir}/events.ndjson"
