"""The Nsight Systems plan: which nsys works, and installing one only when asked.

There is no network and no root apt here: the install test runs stand-in scripts in place
of the apt steps (each a real process whose output is streamed), and a stand-in ``nsys``
that answers ``--version`` and ``profile`` the way the real one does (its version line is
the format ``tools.parse_nsys_version`` reads).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuws.remote_agent import serve
from gpuws.remote_agent.pod.tools import nsys_installs
from gpuws.remote_agent.profilers import nsys_provision as np

UBUNTU = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
ROCKY = 'NAME="Rocky Linux"\nVERSION_ID="9.4"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'
BUNDLED = {"path": "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
           "version": None, "error": "the nsys bundled inside Nsight Compute cannot profile"}


def test_a_working_nsys_is_chosen_newest_first() -> None:
    plan = np.plan_nsys([BUNDLED, {"path": "/a/nsys", "version": "2023.4.4"},
                         {"path": "/b/nsys", "version": "2024.5.1"}], "13.0", UBUNTU, True,
                        "x86_64")
    assert plan["selected"] == "/b/nsys" and plan["install_plan"] is None


def test_root_on_ubuntu_gets_the_package_of_the_drivers_cuda() -> None:
    plan = np.plan_nsys([BUNDLED], "13.0", UBUNTU, True, "x86_64")
    assert plan["selected"] is None and plan["install_target"] == "cuda-nsight-systems-13-0"
    steps = plan["install_plan"]
    assert steps[0][3].endswith("/repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb")
    assert steps[0][4:] == ["dpkg", "-i"] and steps[1][-1] == "update"
    assert steps[-1][-1] == "cuda-nsight-systems-13-0" and "install" in steps[-1]
    assert "bundled inside Nsight Compute" in plan["reason"]
    dnf = np.plan_nsys([], "12.4", ROCKY, True, "aarch64")
    assert dnf["install_plan"][-1] == ["dnf", "install", "-y", "cuda-nsight-systems-12-4"]
    assert "/rhel9/sbsa/" in dnf["install_plan"][0][-2]


@pytest.mark.parametrize("cuda, osr, root, machine, says", [
    ("13.0", UBUNTU, False, "x86_64", "needs root"),
    (None, UBUNTU, True, "x86_64", "CUDA version is unknown"),
    ("13.0", 'ID=alpine\nVERSION_ID=3.20\n', True, "x86_64", "no CUDA repository"),
    ("13.0", UBUNTU, True, "ppc64le", "no CUDA repository"),
])
def test_no_plan_says_why(cuda: str | None, osr: str, root: bool, machine: str,
                          says: str) -> None:
    plan = np.plan_nsys([], cuda, osr, root, machine)
    assert plan["install_plan"] is None and says in plan["reason"]


FAKE_NSYS = """#!/bin/sh
if [ "$1" = "--version" ]; then
    echo "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"; exit 0
fi
if [ "$1" = "profile" ]; then
    while [ "$1" != "-o" ]; do shift; done
    touch "$2.%s"; exit 0
fi
exit 2
"""


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_install_runs_only_when_asked_then_verifies(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    nsys = tmp_path / "opt" / "nsys"
    nsys.parent.mkdir()
    step = _script(tmp_path / "apt-standin.sh",
                   "#!/bin/sh\necho 'Setting up nsight-systems (stand-in)'\n"
                   f"cat > {nsys} <<'EOS'\n{FAKE_NSYS % 'nsys-rep'}EOS\nchmod +x {nsys}\n")

    def current() -> dict[str, Any]:
        found = nsys_installs([str(nsys)]) if nsys.exists() else []
        plan = np.plan_nsys(found, "13.0", UBUNTU, True, "x86_64")
        if plan["install_plan"]:
            plan["install_plan"] = [[step]]
        return plan

    monkeypatch.setattr(np, "current_plan", current)
    sent: list[dict[str, Any]] = []
    shown = np.plan_event(False, 1, sent.append)
    assert shown["install_plan"] == [[step]] and not nsys.exists() and sent == []
    done = np.plan_event(True, 2, sent.append)
    assert done["installed"] and done["selected"] == str(nsys) and done["req"] == 2
    assert "2024.5.1" in done["verified"] and "wrote a report" in done["verified"]
    assert any("stand-in" in str(e.get("message")) for e in sent)


def test_verify_refuses_an_nsys_that_leaves_only_a_qdstrm(tmp_path: Path) -> None:
    broken = _script(tmp_path / "nsys", FAKE_NSYS % "qdstrm")
    with pytest.raises(RuntimeError, match=r"wrote no report .*smoke\.qdstrm"):
        np.verify(broken, python=sys.executable, timeout_s=60)
    good = _script(tmp_path / "nsys-ok", FAKE_NSYS % "nsys-rep")
    assert "smoke profile wrote a report" in np.verify(good, python=sys.executable,
                                                       timeout_s=60)


def test_serve_knows_the_nsys_plan_request() -> None:
    assert serve.REQUEST_FIELDS["nsys_plan"] == {"type", "req", "install"}
    assert "nsys_plan" in serve.HANDLERS
