"""``gpuws trace RUN``: the run's timeline as a Chrome/Perfetto trace file here.

The trace is the artifact a Tier 2 run keeps (``timeline.trace.json.gz``); it comes home
with ``gpuws pull`` (or the run's own pull), is checked again (:mod:`gpuws.live.tracefile`)
and written where ``-o`` says: gzipped when the name ends in ``.gz``, plain JSON otherwise.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import GpuwsError, UsageError
from ..live import tracefile
from ..sessions.store import Store
from ..text.textsafe import visible
from .common import console
from .history import find_run

#: The artifact's name (remote_agent/measure/timeline_trace.FILE_NAME).
ARTIFACT = "timeline.trace.json.gz"
#: Bytes of a pulled trace read (the agent keeps ~10^6 events, ~100 MB gzipped at most).
MAX_FILE_BYTES = 512 << 20


async def trace(args: argparse.Namespace) -> int:
    with Store() as store:
        run = find_run(store, args.run_id)
        rows = [r for r in store.artifacts(run.run_id) if r.name == ARTIFACT]
    if not rows:
        raise UsageError(f"run {run.run_id} kept no timeline trace",
                         title="No trace",
                         remedy="only a Tier 2 run through torch.profiler keeps one; run with "
                                "--tiers 2 (or the default tiers)")
    row = rows[0]
    if row.status != "pulled" or not row.local_path:
        raise UsageError(f"run {run.run_id}'s timeline trace is still on the pod "
                         f"({row.status})", title="Trace not pulled",
                         remedy=f"gpuws pull {run.run_id}")
    try:
        with open(row.local_path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise GpuwsError(f"cannot read {row.local_path}: {exc.strerror or exc}",
                         title="Trace unreadable", remedy=f"gpuws pull {run.run_id}") from None
    if len(data) > MAX_FILE_BYTES:
        raise tracefile.TraceError(f"the run's timeline trace is over {MAX_FILE_BYTES >> 20} "
                                   "MiB", title="Trace refused")
    doc, note = tracefile.validate(tracefile.read_json(data))
    out = Path(args.output or f"{run.run_id}.trace.json.gz")
    body = tracefile.dump(doc, gz=out.name.endswith(".gz"))
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_bytes(body)
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}",
                         title="Trace not written", remedy="choose another -o FILE") from None
    con = console(markup=False)
    if note:
        con.print(visible(f"gpuws: trace clipped: {note}"))
    con.print(visible(f"wrote {out} ({len(doc['traceEvents'])} events, {len(body)} B)"))
    con.print("open it at https://ui.perfetto.dev (Open trace file) or in Chrome at "
              "chrome://tracing (Load)")
    return 0
