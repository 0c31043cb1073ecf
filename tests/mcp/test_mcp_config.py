"""What the person sets for the agent: the config keys and ``gpuws mcp``'s options,
refused in one line before anything is served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.config import host_config, load_config
from gpuws.errors import ConfigError, UsageError


def _config(text: str) -> None:
    Path(os.environ["GPUWS_CONFIG"]).write_text(text)


def test_the_agent_keys_default_to_no_and_are_merged_per_host() -> None:
    _config("[defaults]\nagent = true\n[hosts.pod]\nagent_may_start_stop = true\n"
            "[hosts.shut]\nagent = false\n")
    cfg = load_config()
    assert host_config(cfg, "pod").agent and host_config(cfg, "pod").agent_may_start_stop
    assert host_config(cfg, "shut").agent is False
    _config("")
    assert host_config(load_config(), "pod").agent is None


@pytest.mark.parametrize("value", ['"yes"', "1", "[true]"])
def test_a_key_that_is_not_a_bool_stops_the_server_before_it_serves(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    _config(f"[hosts.pod]\nagent = {value}\n")
    assert main(["mcp"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("gpuws: ") and "hosts.pod.agent" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--budget-usd", "-1"], ["--budget-usd", "nan"],
                                  ["--max-run-seconds", "0"], ["--max-run-seconds", "inf"]])
def test_bounds_out_of_range_are_refused(argv: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["mcp", *argv])
    assert exc.value.code == UsageError.exit_code
    assert argv[0] in capsys.readouterr().err
