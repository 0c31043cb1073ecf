"""`gpuws doctor` and the agent link against a real OpenSSH sshd on 127.0.0.1."""

from __future__ import annotations

import asyncio
import getpass
import json
from pathlib import Path

import pytest

from gpuws import deploy
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import AuthError, ConnectError, HostKeyError, NoPythonError
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer, keygen  # type: ignore[import-not-found]


def doctor_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    code = main(["doctor", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def test_doctor_over_ssh_reports_the_pod(ssh_config: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, r, err = doctor_json(capsys, "pod", "-F", str(ssh_config))
    assert code == 0, err
    assert r["host"] == "pod"
    assert r["transport"] == {"kind": "ssh", "sftp": True, "notes": []}
    assert r["agent"]["sha256"] == deploy.build_bundle().sha256
    assert r["agent"]["cache_state"] == "need"
    assert r["agent"]["transferred_bytes"] == deploy.build_bundle().size
    assert r["python"]["version"].startswith("3.")
    for key in ("gpus", "driver", "cuda_driver"):
        assert key in r
    assert isinstance(r["ncu"]["installs"], list) and isinstance(r["nsys"]["installs"], list)
    for key in ("rm_profiling_admin_only", "cap_sys_admin", "cap_perfmon"):
        assert key in r["counters"]
    assert r["timings"]["connect_s"] > 0 and r["timings"]["deploy_s"] > 0
    assert r["system"]["user"] == getpass.getuser()


def test_doctor_local(capsys: pytest.CaptureFixture[str]) -> None:
    code, r, err = doctor_json(capsys, "local")
    assert code == 0, err
    assert r["transport"]["kind"] == "local"
    assert r["agent"]["version"]


def test_second_connect_uploads_nothing(ssh_config: Path, sshd: SshServer,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, first, _ = doctor_json(capsys, "pod", "-F", str(ssh_config))
    _, second, _ = doctor_json(capsys, "pod", "-F", str(ssh_config))
    assert first["agent"]["transferred_bytes"] > 0
    assert second["agent"]["cache_state"] == "cached"
    assert second["agent"]["transferred_bytes"] == 0
    cached = sshd.pod_cache / "agent" / f"{deploy.build_bundle().sha256}.pyz"
    assert cached.read_bytes() == deploy.build_bundle().data
    assert oct(cached.stat().st_mode & 0o777) == "0o600"


def test_corrupted_cache_is_replaced(ssh_config: Path, sshd: SshServer,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    doctor_json(capsys, "pod", "-F", str(ssh_config))
    cached = sshd.pod_cache / "agent" / f"{deploy.build_bundle().sha256}.pyz"
    cached.write_bytes(cached.read_bytes()[:-100] + b"x" * 100)
    code, r, err = doctor_json(capsys, "pod", "-F", str(ssh_config))
    assert code == 0, err
    assert r["agent"]["cache_state"] == "corrupt"
    assert cached.read_bytes() == deploy.build_bundle().data


def test_no_sftp_pod_still_moves_files(sshd_nosftp: SshServer, tmp_path: Path) -> None:
    cfg = sshd_nosftp.client_files(tmp_path / "c")
    run_dir = sshd_nosftp.pod_cache / "runs" / "r1"

    async def go() -> bytes:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))
        try:
            assert client.transport.info.sftp is False
            assert "exec channel" in " ".join(client.transport.info.notes)
            run_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
            (run_dir / "blob.bin").write_bytes(bytes(range(256)) * 4096)
            chunks = [c async for c in client.transport.read_file(
                str(run_dir / "blob.bin"), 1000, client.agent_argv())]
            return b"".join(chunks)
        finally:
            await client.close()

    data = asyncio.run(go())
    assert data == (bytes(range(256)) * 4096)[1000:]


def test_unknown_host_key_refused_then_accept_new(sshd: SshServer, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "c", known=False)
    code, _, err = doctor_json(capsys, "pod", "-F", str(cfg))
    assert code == HostKeyError.exit_code
    assert "Unknown host key" in err and "SHA256:" in err and "--accept-new" in err
    assert (tmp_path / "c" / "known_hosts").read_text() == ""
    code, _, err = doctor_json(capsys, "pod", "-F", str(cfg), "--accept-new")
    assert code == 0, err
    recorded = (tmp_path / "c" / "known_hosts").read_text()
    assert recorded.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    code, _, err = doctor_json(capsys, "pod", "-F", str(cfg))  # now known, no flag needed
    assert code == 0, err


def test_changed_host_key_always_refused(sshd: SshServer, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "c")
    other = tmp_path / "other_key"
    keygen(other)
    pub = (tmp_path / "other_key.pub").read_text().split()
    (tmp_path / "c" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    before = (tmp_path / "c" / "known_hosts").read_text()
    code, _, err = doctor_json(capsys, "pod", "-F", str(cfg), "--accept-new")
    assert code == HostKeyError.exit_code
    assert "CHANGED" in err and "ssh-keygen -R" in err
    assert (tmp_path / "c" / "known_hosts").read_text() == before


def test_wrong_key_is_an_auth_error(sshd: SshServer, tmp_path: Path) -> None:
    cfg = sshd.client_files(tmp_path / "c")
    wrong = tmp_path / "wrong"
    keygen(wrong)
    cfg.write_text(cfg.read_text().replace(str(sshd.client_key), str(wrong)))
    with pytest.raises(AuthError, match="refused our keys"):
        asyncio.run(SSHTransport("pod", config_file=str(cfg)).connect())


def test_wrong_user_is_an_auth_error(sshd: SshServer, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "c")
    code = main(["doctor", "pod", "-F", str(cfg), "-l", "nobody-gpuws-test"])
    assert code == AuthError.exit_code
    assert "Authentication failed" in capsys.readouterr().err


def test_unreachable_port(sshd: SshServer, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    from sshd import free_port  # type: ignore[import-not-found]

    cfg = sshd.client_files(tmp_path / "c")
    code = main(["doctor", "pod", "-F", str(cfg), "-p", str(free_port())])
    err = capsys.readouterr().err
    assert code == ConnectError.exit_code
    assert "Connection refused" in err and "sshd" in err
    assert len(err.strip().splitlines()) == 1


def test_no_python_on_the_pod(sshd_nopython: SshServer, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd_nopython.client_files(tmp_path / "c")
    code = main(["doctor", "pod", "-F", str(cfg)])
    err = capsys.readouterr().err
    assert code == NoPythonError.exit_code
    assert "No usable python3" in err and "python3" in err
    assert len(err.strip().splitlines()) == 1


def test_user_at_host_port_destination(sshd: SshServer, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "c", alias="*")
    sshd.reset_pod()
    code, r, err = doctor_json(capsys, f"{getpass.getuser()}@127.0.0.1:{sshd.port}",
                               "-F", str(cfg))
    assert code == 0, err
    assert r["transport"]["kind"] == "ssh"


def test_proxy_jump(sshd: SshServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sshd.client_files(tmp_path / "c", alias="jump")
    text = cfg.read_text()
    # The target is reached *through* the jump host: its HostName is resolved there.
    cfg.write_text(text + text.replace("Host jump", "Host pod") + "  ProxyJump jump\n")
    code, r, err = doctor_json(capsys, "pod", "-F", str(cfg))
    assert code == 0, err
    assert r["transport"]["kind"] == "ssh"
