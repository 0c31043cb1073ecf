"""The PTY-only transport beside SFTP and exec, on real OpenSSH servers on loopback.

Two figures (issue 6):

- pull throughput of a 64 MiB artifact: SFTP, the agent's ``cat`` on an exec channel,
  and the agent's ``cat64`` frames through a terminal — all on the *same* sshd (the
  terminal forced with ``pty=True``) — plus the terminal through a RunPod-like proxy
  (tests/transport/pty_proxy.sh as ForceCommand: banner, login shell, no exec/SFTP).
  Time from the request to the last verified byte, so the terminal's session start is
  included, as it is in a real pull. Two artifacts: random bytes (the worst case for
  the terminal, which then sends plain base64) and a real .ncu-rep repeated to size
  (frames go zlib-compressed). The goal is >= 25% of SFTP.
- connect-to-Hello: ``AgentClient.connect`` with the bundle already cached on the pod
  (exec vs terminal on the same sshd, and the proxy with its exec-refused detection).

Every figure is the median of several runs::

    python3 bench/pty.py [--mib 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

from gpuws.client import AgentClient
from gpuws.transport.pty import PTYTransport
from gpuws.transport.ssh import SSHTransport


def _sshd_module() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "tests" / "sshd.py"
    spec = importlib.util.spec_from_file_location("gpuws_bench_sshd", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


Make = Callable[[], SSHTransport]


async def _pull_once(make: Make, path: str, size: int, digest: str,
                     no_sftp: bool = False) -> float:
    client = await AgentClient.connect(make())
    try:
        t = client.transport
        assert isinstance(t, SSHTransport)
        if no_sftp and t._sftp is not None:  # measure the exec channel's `cat` instead
            t._sftp.exit()
            t._sftp = None
        h = hashlib.sha256()
        got = 0
        start = time.perf_counter()
        async for chunk in t.read_file(path, 0, client.agent_argv()):
            h.update(chunk)
            got += len(chunk)
        elapsed = time.perf_counter() - start
    finally:
        await client.close()
    if got != size or h.hexdigest() != digest:
        raise SystemExit(f"pull of {path} came back wrong ({got} of {size} bytes)")
    return elapsed


async def _hello_once(make: Make) -> float:
    start = time.perf_counter()
    client = await AgentClient.connect(make())
    elapsed = time.perf_counter() - start
    await client.close()
    return elapsed


async def _median(runs: int, once: Callable[[], Awaitable[float]]) -> float:
    return statistics.median([await once() for _ in range(runs)])


async def bench(mib: int, runs: int) -> None:
    sshd = _sshd_module()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        full = sshd.SshServer(root / "full", "default").start()
        proxy = sshd.SshServer(root / "proxy", "ptyproxy").start()
        try:
            full_cfg = str(full.client_files(root / "c-full"))
            proxy_cfg = str(proxy.client_files(root / "c-proxy"))
            report = (Path(__file__).resolve().parent.parent / "tests" / "fixtures"
                      / "recorded" / "saxpy_h200.ncu-rep").read_bytes()
            artifacts = {
                "random": os.urandom(mib << 20),
                # A real Nsight Compute report, repeated: as compressible as reports are.
                "report": (report * ((mib << 20) // len(report) + 1))[:mib << 20],
            }
            files: dict[tuple[str, str], str] = {}
            for server in (full, proxy):
                run_dir = server.pod_cache / "runs" / "bench"
                run_dir.mkdir(parents=True, mode=0o700)
                for kind, data in artifacts.items():
                    (run_dir / f"{kind}.bin").write_bytes(data)
                    files[server.variant, kind] = str(run_dir / f"{kind}.bin")

            def ssh() -> SSHTransport:
                return SSHTransport("pod", config_file=full_cfg)

            def pty_same() -> SSHTransport:
                return PTYTransport("pod", config_file=full_cfg, pty=True)

            def pty_proxy() -> SSHTransport:
                return PTYTransport("pod", config_file=proxy_cfg)

            for make in (ssh, pty_same, pty_proxy):  # deploy once: later connects are cached
                await _hello_once(make)
            size = mib << 20
            pulls = []
            for kind, data in artifacts.items():
                digest = hashlib.sha256(data).hexdigest()
                fp, pp = files["default", kind], files["ptyproxy", kind]

                async def pull(make: Make, path: str, no_sftp: bool = False,
                               digest: str = digest) -> float:
                    return await _median(runs, lambda: _pull_once(make, path, size, digest,
                                                                  no_sftp))

                pulls += [
                    (kind, "SFTP", await pull(ssh, fp)),
                    (kind, "exec channel (agent cat)", await pull(ssh, fp, True)),
                    (kind, "PTY, same sshd (--pty)", await pull(pty_same, fp)),
                    (kind, "PTY, RunPod-like proxy", await pull(pty_proxy, pp)),
                ]
            hello_runs = max(5, runs)
            hellos = [
                ("exec", await _median(hello_runs, lambda: _hello_once(ssh))),
                ("PTY, same sshd (--pty)", await _median(hello_runs,
                                                         lambda: _hello_once(pty_same))),
                ("PTY, RunPod-like proxy (detects)", await _median(
                    hello_runs, lambda: _hello_once(pty_proxy))),
            ]
        finally:
            full.stop()
            proxy.stop()
    print(f"pull of a {mib} MiB artifact (median of {runs}, sha256 verified); 'random' is "
          "incompressible, 'report' an .ncu-rep repeated")
    print(f"  {'artifact':<8} {'path':<28} {'seconds':>8} {'MiB/s':>8} {'vs SFTP':>8}")
    for kind, name, secs in pulls:
        sftp_s = next(s for k, n, s in pulls if k == kind and n == "SFTP")
        print(f"  {kind:<8} {name:<28} {secs:>8.2f} {mib / secs:>8.1f} {sftp_s / secs:>7.0%}")
    exec_s = hellos[0][1]
    print(f"connect-to-Hello, bundle cached (median of {hello_runs})")
    print(f"  {'path':<34} {'seconds':>8} {'vs exec':>8}")
    for name, secs in hellos:
        print(f"  {name:<34} {secs:>8.3f} {secs / exec_s:>7.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64, help="artifact size in MiB (default 64)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as home:
        # Keep the laptop side hermetic: no store or config of the person running it.
        os.environ["GPUWS_HOME"] = home
        os.environ.pop("SSH_AUTH_SOCK", None)
        asyncio.run(bench(args.mib, args.runs))


if __name__ == "__main__":
    main()
