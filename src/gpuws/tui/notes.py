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


def why_no_verdict(model: RunModel) -> str | None:
    """Why a finished run has no verdict (Tiers 2 and 3 give it); None while it may come.

    ``no verdict: Tiers 2 and 3 were skipped`` rather than "no verdict yet" for a run
    that is over.
    """
    finished = model.finished
    if finished is None:
        return None
    words = []
    for tier in (2, 3):
        state = model.tiers.get(tier)
        if model.spec is not None and tier not in model.spec.tiers:
            words.append("not asked for")
        elif state is None:
            words.append(f"not run (the run {finished.status} before it)")
        else:
            words.append(state.status if state.status in _NOTHING else "")
    if "" in words:
        # A tier ran and gave nothing a verdict could be drawn from.
        return "no verdict: Tiers 2 and 3 gave nothing to judge"
    if all(w.startswith("not run") for w in words):
        return f"no verdict: the run {finished.status} before Tiers 2 and 3"
    if words[0] == words[1]:
        return f"no verdict: Tiers 2 and 3 were {words[0]}"
    return f"no verdict: Tier 2 {words[0]}, Tier 3 {words[1]}"
