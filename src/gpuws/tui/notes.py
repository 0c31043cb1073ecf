"""Why a run's pane is empty, once it will stay so (no Textual here).

A pane of a running run says "… yet"; a pane of a run that failed, was cancelled, or
never asked for that tier says why instead, from what the run recorded: the tier's own
status and reason, or the run's error when it ended before the tier began.
"""

from __future__ import annotations

from ..live.model import RunModel

#: Tier statuses that leave a tier's pane empty for good.
_NOTHING = ("failed", "skipped", "cancelled")


def why_missing(model: RunModel, tier: int, what: str) -> str | None:
    """Why the run has no ``what`` of ``tier`` and will not get any; None while it may.

    Args:
        model: the run's panes model.
        tier: the tier that would have produced it.
        what: what is missing, as the pane calls it (``Tier-3 metrics``).
    """
    if model.spec is not None and tier not in model.spec.tiers:
        chosen = ", ".join(str(t) for t in model.spec.tiers)
        return f"no {what}: Tier {tier} was not asked for (tiers {chosen})"
    state = model.tiers.get(tier)
    finished = model.finished
    error = (finished.error or "").strip() if finished is not None else ""
    if state is not None and state.status in _NOTHING:
        reason = state.reason or error
        return f"no {what}: Tier {tier} {state.status}" + (f" — {reason}" if reason else "")
    if finished is None:
        return None
    if state is None:
        return (f"no {what}: the run {finished.status} before Tier {tier}"
                + (f" — {error}" if error else ""))
    if state.status != "running":
        return f"no {what}: Tier {tier} ended ({state.status}) without any"
    return None
