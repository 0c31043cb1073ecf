"""Which GPU a run uses: ``--gpu`` as an index, a UUID or a prefix, against real GPU lists.

The GPU lists are parsed from the real multi-GPU ``nvidia-smi -q -x`` captures in
tests/fixtures/nvidia-smi/ (4 × K80, 2 × A5000) and the H200's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws.protocol import GpuTarget
from gpuws.remote_agent.pod import gpuinfo, gpusel

FIXTURES = Path(__file__).parents[2] / "fixtures"


def gpus_of(name: str) -> list[dict[str, Any]]:
    path = FIXTURES / "nvidia-smi" / name if "/" not in name else FIXTURES / name
    return list(gpuinfo.parse_nvidia_smi_xml(path.read_text())["gpus"])


K80 = gpus_of("pai_tesla_k80_x4_430.26.xml")
A5000 = gpus_of("telegraf_rtx_a5000_x2_590.44.01.xml")
H200 = gpus_of("ncu-2025.3.1-h200/nvidia_smi_q.xml")


@pytest.mark.parametrize("wanted, index", [
    ("0", 0), ("3", 3), ("01", 1),
    ("GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1", 1),   # a whole UUID
    ("gpu-B01B80EB-0F18-1DF0-CF88-0725BD90F1E1", 1),   # case does not matter
    ("GPU-30bc", 2),                                    # a unique prefix
    ("3341aba2", 3),                                    # a prefix without "GPU-"
    (" 2 ", 2),
])
def test_index_uuid_and_prefix(wanted: str, index: int) -> None:
    assert gpusel.resolve(wanted, K80)["index"] == index


def test_missing_gpu_names_every_choice_in_one_line() -> None:
    with pytest.raises(ValueError) as err:
        gpusel.resolve("7", K80)
    text = str(err.value)
    assert "\n" not in text and "'7'" in text
    for gpu in K80:
        assert f"{gpu['index']} = Tesla K80 ({gpu['uuid']})" in text


def test_ambiguous_prefix_asks_for_more() -> None:
    with pytest.raises(ValueError, match="matches 2 GPUs") as err:
        gpusel.resolve("GPU-3", K80)  # GPU-30bc2701… and GPU-3341aba2…
    assert "give more of the UUID" in str(err.value)
    with pytest.raises(ValueError, match="matches 2 GPUs"):
        gpusel.resolve("GPU-12345678-aaaa", A5000)
    assert gpusel.resolve("GPU-12345678-aaaa-bbbb-cccc-0123456789cd", A5000)["index"] == 1


@pytest.mark.parametrize("wanted, why", [
    ("GPU-ffff", "starting"),
    ("MIG-4f3c", "MIG instance"),
    ("first", "not a GPU index or UUID"),
    ("", "not a GPU index or UUID"),
    ("0\x1b[2J", "not a GPU index or UUID"),
    ("9" * 200, "not a GPU index or UUID"),
])
def test_what_is_refused(wanted: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as err:
        gpusel.resolve(wanted, K80)
    assert "\x1b" not in str(err.value) and len(str(err.value)) < 1000


def test_choose_pins_only_what_was_asked() -> None:
    asked = gpusel.choose("1", {}, K80)
    assert asked.pinned and asked.gpu is not None and asked.gpu["index"] == 1
    assert asked.busy == [{"pid": 58642, "name": "python", "used_mib": 576.0}]
    default = gpusel.choose(None, {}, K80)
    assert not default.pinned and default.gpu is not None and default.gpu["index"] == 0
    missing = gpusel.choose("7", {}, K80)
    assert missing.gpu is None and missing.error and "there is no GPU '7'" in missing.error
    assert "--gpu INDEX" in missing.remedy


def test_choose_on_a_pod_without_gpus() -> None:
    none = gpusel.choose("0", {}, [], "no NVIDIA driver: libnvidia-ml.so.1 not found")
    assert none.error is not None and "has none (no NVIDIA driver" in none.error
    assert gpusel.choose(None, {}, []) == gpusel.Choice(None, False, [])


@pytest.mark.parametrize("env, index", [
    ({}, 0),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2),
    ({"CUDA_VISIBLE_DEVICES": "GPU-3341aba2-f01d-2c1f-7dd4-e389779faec2,0"}, 3),
    ({"CUDA_VISIBLE_DEVICES": "GPU-b01b"}, 1),  # CUDA accepts a unique prefix too
    ({"CUDA_VISIBLE_DEVICES": ""}, None),  # every GPU hidden
    ({"CUDA_VISIBLE_DEVICES": "MIG-4f3c8a1e-0000-0000-0000-000000000000"}, None),
    ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, None),
    ({"CUDA_VISIBLE_DEVICES": "9"}, None),
])
def test_the_gpu_cuda_uses_without_pinning(env: dict[str, str], index: int | None) -> None:
    found = gpusel.inherited(env, K80)
    assert (None if found is None else found["index"]) == index


def test_fastest_first_is_known_on_a_single_gpu() -> None:
    found = gpusel.inherited({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, H200)
    assert found is not None and found["index"] == 0


def test_pin_sets_uuid_and_pci_order_and_reports_what_it_replaced() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "HOME": "/r"}
    replaced = gpusel.pin(env, gpusel.choose("2", env, K80))
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-30bc2701-3bc2-5f35-0ebd-9867a077e138",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HOME": "/r"}
    assert replaced == "0,1"


def test_pin_without_uuid_uses_the_index() -> None:
    gpus = [dict(K80[2], uuid=None)]
    env: dict[str, str] = {}
    gpusel.pin(env, gpusel.choose("2", env, gpus))
    assert env["CUDA_VISIBLE_DEVICES"] == "2"


def test_unpinned_runs_keep_their_devices_but_count_in_pci_order() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert gpusel.pin(env, gpusel.choose(None, env, K80)) is None
    assert env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    own = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    gpusel.pin(own, gpusel.choose(None, own, K80))
    assert own == {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}  # the run's own order is kept


def test_ncu_device_filter_only_when_pinned() -> None:
    assert gpusel.ncu_device_args(gpusel.choose("3", {}, K80)) == ["--devices", "0"]
    assert gpusel.ncu_device_args(gpusel.choose(None, {}, K80)) == []
    assert gpusel.ncu_device_args(None) == []


def test_target_event_decodes_as_gpu_target() -> None:
    event = gpusel.target_event(gpusel.choose("GPU-c3b2", {}, K80))
    target = msgspec.convert(event, GpuTarget, strict=True)
    assert (target.index, target.name) == (0, "Tesla K80")
    assert target.busy[0].pid == 58813 and target.busy[0].used_mib == 576.0
    assert gpusel.target_event(gpusel.Choice(None, False, [])) is None


def test_busy_sentence_names_pid_name_and_memory() -> None:
    text = gpusel.busy_sentence(gpusel.choose("0", {}, A5000))
    assert text == ("GPU 0 (NVIDIA RTX A5000) is in use by 1 other process: pid 100477 "
                    "/root/src/llama.cpp/build/bin/llama-server (22,430 MiB)")
    many = gpusel.Choice(K80[0], True, [{"pid": i, "name": "", "used_mib": None}
                                        for i in range(1, 11)])
    text = gpusel.busy_sentence(many)
    assert "10 other processes" in text and "(name not visible here)" in text
    assert text.endswith("and 2 more")
