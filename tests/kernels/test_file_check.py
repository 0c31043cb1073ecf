"""``check(state)`` in ``file:`` workloads: a result proved right before it is timed.

The files do plain Python work (no GPU on CI machines): what is tested is the contract
(when check runs, on which inputs, what a failure says), with the two cheats an agent
tuned on the timer reaches for: an output cached from an earlier call, and work skipped.
The GPU version of the cheat is tests/gpu/mcp_agent_loop.py's.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from gpuws.kernels.workload import load_file_workload

SEEDED_SETUP = """
    import random

    def setup(seed):
        rng = random.Random(seed)
        x = [rng.random() for _ in range(64)]
        return {"x": x, "out": [0.0] * 64}

    def check(state):
        return all(o == 2 * v for o, v in zip(state["out"], state["x"]))
"""


def _load(tmp_path: Path, source: str) -> object:
    path = tmp_path / "bench.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    w = load_file_workload(str(path))
    w.setup()
    return w


def _verify(w: object) -> str | None:
    syncs: list[int] = []
    result = w.verify(lambda: syncs.append(1))  # type: ignore[attr-defined]
    assert syncs  # the GPU is waited for before each check
    return result  # type: ignore[no-any-return]


def test_an_honest_kernel_passes_on_fresh_inputs(tmp_path: Path) -> None:
    w = _load(tmp_path, SEEDED_SETUP + """
    def run(state):
        state["out"][:] = [2 * v for v in state["x"]]
    """)
    assert "fresh inputs" in (_verify(w) or "")


def test_an_output_cached_across_calls_is_caught(tmp_path: Path) -> None:
    w = _load(tmp_path, SEEDED_SETUP + """
    CACHE = []

    def run(state):
        if not CACHE:
            CACHE.append([2 * v for v in state["x"]])
        state["out"][:] = CACHE[0]
    """)
    with pytest.raises(ValueError, match=r"returned False on fresh inputs .* not timed"):
        _verify(w)


def test_skipped_work_is_caught_on_the_first_inputs(tmp_path: Path) -> None:
    w = _load(tmp_path, SEEDED_SETUP + """
    def run(state):
        pass
    """)
    with pytest.raises(ValueError, match="returned False on the first set-up inputs"):
        _verify(w)


def test_a_setup_without_a_seed_gets_fresh_inputs_by_reseeding(tmp_path: Path) -> None:
    # The file draws from the module-level generator, as torch.randn would: gpuws reseeds
    # it, so the second setup's inputs differ and the cache is caught.
    w = _load(tmp_path, """
    import random
    CACHE = []

    def setup():
        return {"x": [random.random() for _ in range(8)], "out": [0.0] * 8}

    def run(state):
        if not CACHE:
            CACHE.append([2 * v for v in state["x"]])
        state["out"][:] = CACHE[0]

    def check(state):
        assert state["out"] == [2 * v for v in state["x"]], "wrong output"
    """)
    with pytest.raises(ValueError, match=r"bench.py:\d+: check\(state\) failed on fresh "
                                         r"inputs .*AssertionError: wrong output"):
        _verify(w)


@pytest.mark.parametrize("error, passes", [(1e-6, True), (1e-3, True), (2e-3, False),
                                           (math.nan, False), (math.inf, False)])
def test_a_relative_error_is_held_to_the_tolerance(tmp_path: Path, error: float,
                                                   passes: bool) -> None:
    w = _load(tmp_path, f"""
    def setup():
        return {{}}

    def run(state):
        pass

    def check(state):
        return float({error!r})
    """.replace("float(nan)", "float('nan')").replace("float(inf)", "float('inf')"))
    if passes:
        assert _verify(w)
    else:
        with pytest.raises(ValueError, match=r"over CHECK_TOLERANCE 0\.001"):
            _verify(w)


def test_the_file_may_set_its_tolerance(tmp_path: Path) -> None:
    w = _load(tmp_path, """
    CHECK_TOLERANCE = 0.05

    def setup():
        return {}

    def run(state):
        pass

    def check(state):
        return 0.01
    """)
    assert _verify(w)


def test_without_check_nothing_is_run_early(tmp_path: Path) -> None:
    w = _load(tmp_path, """
    calls = []

    def run():
        calls.append(1)
    """)
    assert w.verify(lambda: None) is None  # type: ignore[attr-defined]
    assert w.module.calls == []  # type: ignore[attr-defined]


def test_a_check_that_is_not_a_function_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "bench.py"
    path.write_text("def run():\n    pass\ncheck = 3\n")
    with pytest.raises(ValueError, match="check is a int, not a function"):
        load_file_workload(str(path))
