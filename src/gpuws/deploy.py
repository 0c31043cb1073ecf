"""Building the agent bundle and starting it on the pod through a stage-1 bootstrap.

The bundle is a deterministic zipapp of ``gpuws.remote_agent`` + ``gpuws.kernels`` (fixed
timestamps, sorted entries, fixed modes), so the same sources always give the same
sha256, and the pod caches it as ``~/.cache/gpuws/agent/<sha>.pyz``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import shlex
import time
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import protocol
from .errors import DeployError, NoPythonError, ProtocolError
from .transport.base import RemoteProcess, Transport

_PKG_ROOT = Path(__file__).resolve().parent
_BUNDLED = ("remote_agent", "kernels")
_MAIN = b"import sys\nfrom gpuws.remote_agent.__main__ import main\nsys.exit(main())\n"
#: The pod's cache dir; ``GPUWS_POD_CACHE`` overrides (tests keep the pod side hermetic).
POD_CACHE = "${GPUWS_POD_CACHE:-$HOME/.cache/gpuws}"


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


@lru_cache(maxsize=1)
def build_bundle() -> Bundle:
    """The agent zipapp (deterministic: same sources, same bytes)."""
    init = (_PKG_ROOT / "__init__.py").read_bytes()
    files: list[tuple[str, bytes]] = [("__main__.py", _MAIN), ("gpuws/__init__.py", init)]
    for sub in _BUNDLED:
        for path in sorted((_PKG_ROOT / sub).rglob("*.py")):
            rel = path.relative_to(_PKG_ROOT.parent).as_posix()
            files.append((rel, path.read_bytes()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data, compresslevel=9)
    data = buf.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest())


# Stage 1, run as `python3 -c BOOTSTRAP SHA SIZE CMD...`. It must parse on old Pythons so
# that a too-old one can say so: no f-strings, no walrus. It reads the cache dir from
# GPUWS_POD_CACHE or ~/.cache/gpuws, refuses a cache dir owned by someone else or
# writable by others (a shared pod), starts the cached bundle if its sha256 matches, and
# otherwise asks for it ("need"/"corrupt"), reads exactly SIZE bytes from stdin with
# unbuffered os.read (a buffered read could swallow the first request after exec),
# verifies the hash, writes it atomically (temp + fsync + rename, mode 0600) and execs it
# with stdin/stdout carried over to the agent.
BOOTSTRAP = r'''
import hashlib, os, sys
def w(s):
    os.write(1, s.encode())
v = sys.version_info
if v < (3, 8):
    w("GPUWS-BOOT old-python %d.%d.%d %s\n" % (v[0], v[1], v[2], sys.executable)); sys.exit(3)
sha, size = sys.argv[1], int(sys.argv[2])
root = os.environ.get("GPUWS_POD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gpuws")
d = os.path.join(root, "agent")
for p in (root, d):
    if not os.path.isdir(p):
        os.makedirs(p, 0o700)
    st = os.lstat(p)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        w("GPUWS-BOOT unsafe-cache %s\n" % p); sys.exit(6)
path = os.path.join(d, sha + ".pyz")
def digest(p):
    try:
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
state = "cached"
if digest(path) != sha:
    state = "corrupt" if os.path.exists(path) else "need"
    w("GPUWS-BOOT %s %s\n" % (state, sha))
    buf = bytearray()
    while len(buf) < size:
        c = os.read(0, min(1 << 20, size - len(buf)))
        if not c:
            w("GPUWS-BOOT short %d\n" % len(buf)); sys.exit(4)
        buf += c
    if hashlib.sha256(bytes(buf)).hexdigest() != sha:
        w("GPUWS-BOOT bad-hash\n"); sys.exit(5)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, bytes(buf)); os.fsync(fd); os.close(fd)
    os.replace(tmp, path)
w("GPUWS-BOOT start %s\n" % state)
os.execv(sys.executable, [sys.executable, path] + sys.argv[3:])
'''.strip()


@dataclass
class DeployResult:
    """How the agent was started: what we sent and how long it took."""

    sha256: str
    bundle_size: int
    cache_state: str  # cached | need | corrupt
    transferred: int
    deploy_s: float
    hello: protocol.Hello


def bootstrap_argv(bundle: Bundle, command: list[str], python: str = "python3") -> list[str]:
    return [python, "-c", BOOTSTRAP, bundle.sha256, str(bundle.size), *command]


def agent_argv(bundle: Bundle, python: str = "python3") -> list[str]:
    """Start the cached bundle directly (used for side channels such as ``cat``).

    A relative path: exec channels start in the home directory. The ``sh -c`` wrapper is
    a fixed string; the arguments after it arrive as positional parameters, never parsed.
    """
    return ["sh", "-c", f'exec "$0" "{POD_CACHE}/agent/{bundle.sha256}.pyz" "$@"', python]


async def start_agent(transport: Transport, *, python: str = "python3",
                      timeout: float = 60.0) -> tuple[RemoteProcess, DeployResult, bytes]:
    """Start ``serve`` on the pod, uploading the bundle only when the cache lacks it.

    Returns the running process, what happened, and any bytes already read past the
    Hello line (the start of the event stream).
    """
    bundle = build_bundle()
    t0 = time.monotonic()
    proc = await transport.start(bootstrap_argv(bundle, ["serve"], python))
    state = ""
    sent = 0
    buf = b""
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await proc.stdout.read(65536)
                if not chunk:
                    await _explain_failure(proc, python, buf)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode("utf-8", "replace").strip()
                    if text.startswith("GPUWS-BOOT "):
                        word = text.split()[1]
                        if word in ("need", "corrupt"):
                            state = word
                            proc.stdin.write(bundle.data)
                            await proc.stdin.drain()
                            sent = bundle.size
                        elif word == "start":
                            state = text.split()[2]
                        else:
                            _boot_failure(text, python)
                    elif text.startswith("{"):
                        event = protocol.decode_event(line)
                        if not isinstance(event, protocol.Hello):
                            raise ProtocolError(
                                f"expected Hello from the agent, got {text[:120]!r}")
                        if event.protocol_version != protocol.PROTOCOL_VERSION:
                            raise ProtocolError(
                                f"agent speaks protocol {event.protocol_version}, "
                                f"we speak {protocol.PROTOCOL_VERSION}")
                        result = DeployResult(bundle.sha256, bundle.size, state or "cached", sent,
                                              time.monotonic() - t0, event)
                        return proc, result, buf
                    # Anything else before the first frame (a login banner, MOTD) is noise.
    except TimeoutError as exc:
        proc.close()
        raise DeployError(f"the agent did not start within {timeout:.0f} s",
                          remedy="check the pod's load and that python3 runs there") from exc
    except BaseException:
        proc.close()
        raise


def _boot_failure(text: str, python: str) -> None:
    parts = text.split()
    word = parts[1]
    if word == "old-python":
        raise NoPythonError(f"{python} on the pod is Python {parts[2]} ({parts[3]}); "
                            "gpuws needs 3.8 or newer",
                            remedy="install a newer python3 on the pod (e.g. apt-get install "
                                   "python3) or pass --python PATH")
    if word == "unsafe-cache":
        raise DeployError(f"the pod's cache directory {parts[2]} is owned by another user or "
                          "writable by others; refusing to run code from it",
                          remedy=f"remove it or fix its owner/mode (chmod 700 {parts[2]})")
    raise DeployError(f"the bootstrap failed: {text}",
                      remedy="check free disk space in the pod's home directory")


async def _explain_failure(proc: RemoteProcess, python: str, seen: bytes) -> None:
    err = (await proc.stderr.read()).decode("utf-8", "replace").strip()
    status = await proc.wait()
    low = err.lower()
    if status == 127 or "not found" in low or "no such file" in low:
        raise NoPythonError(f"{python} was not found on the pod's PATH "
                            f"(the shell said: {err.splitlines()[-1] if err else 'exit 127'})",
                            remedy="install python3 on the pod, or pass --python PATH")
    if "syntaxerror" in low:
        raise NoPythonError(f"{python} on the pod cannot run the bootstrap (too old?): "
                            f"{err.splitlines()[-1]}",
                            remedy="install python3 >= 3.8 on the pod or pass --python PATH")
    detail = err.splitlines()[-1] if err else (seen.decode("utf-8", "replace").strip()[-200:]
                                               or f"exit status {status}")
    raise DeployError(f"the agent exited before saying hello: {detail}",
                      remedy="run `gpuws doctor` again with -v, or check the pod's disk")


def quote(argv: list[str]) -> str:
    """How a command is shown to people (and sent over SSH)."""
    return shlex.join(argv)
