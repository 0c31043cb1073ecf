"""Findings from numbers: pure functions over a run's events (standard library only).

Bundled with the agent, so the worker can state the program verdict right after Tier 2
(and Tier 3 can say whether its target is worth profiling), and imported again on the
laptop, so a replay or an export of an old session gets today's logic. Every function
here takes event-shaped dicts (the JSON the agent writes) and returns event-shaped
dicts; none reads a file, a clock or a global.
"""
