"""Building the agent bundle and starting it on the pod through a stage-1 bootstrap.

The bundle is a deterministic zipapp of ``gpuws.remote_agent`` + ``gpuws.kernels`` (fixed
timestamps, sorted entries, fixed modes), so the same sources always give the same
sha256, and the pod caches it as ``~/.cache/gpuws/agent/<sha>.pyz``. Its modules travel
without their comments and docstrings (:func:`lean_source`), every line where it was.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import os
import shlex
import time
import zlib
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import protocol
from .errors import DeployError, GpuwsError, NoPythonError, ProtocolError
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


#: Changes whenever the way a bundle is made from the sources changes.
_BUNDLE_FORMAT = b"gpuws-bundle-2 lean zip9\n"


@lru_cache(maxsize=1)
def build_bundle() -> Bundle:
    """The agent zipapp (deterministic: same sources, same bytes).

    Made once per set of sources and kept in the data directory (``bundles/``, keyed by
    a hash of every bundled file): making it (stripping, compressing) takes a few hundred
    ms, which every connect would otherwise pay before the bootstrap even starts.
    """
    init = (_PKG_ROOT / "__init__.py").read_bytes()
    files: list[tuple[str, bytes]] = [("__main__.py", _MAIN), ("gpuws/__init__.py", init)]
    for sub in _BUNDLED:
        for path in sorted((_PKG_ROOT / sub).rglob("*.py")):
            files.append((path.relative_to(_PKG_ROOT.parent).as_posix(), path.read_bytes()))
    key = hashlib.sha256(_BUNDLE_FORMAT)
    for name, data in files:
        key.update(b"%d:%s\0%d:" % (len(name), name.encode(), len(data)) + data)
    cached = _cached_bundle(key.hexdigest())
    if cached is not None:
        return cached
    import zipfile  # here: a connect with the bundle kept in bundles/ never needs it

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, lean_source(data) if name.startswith("gpuws/") else data,
                        compresslevel=9)
    data = buf.getvalue()
    bundle = Bundle(data, hashlib.sha256(data).hexdigest())
    _keep_bundle(key.hexdigest(), bundle)
    return bundle


def _bundle_dir() -> Path:
    from .locations import gpuws_home

    return gpuws_home() / "bundles"


def _cached_bundle(key: str) -> Bundle | None:
    """The bundle made earlier from these sources, if kept and intact (its name carries
    its sha256, checked on every read)."""
    with contextlib.suppress(OSError, GpuwsError):
        for path in _bundle_dir().glob(key + "-*.pyz"):
            data = path.read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            if path.name == f"{key}-{sha}.pyz":
                return Bundle(data, sha)
    return None


def _keep_bundle(key: str, bundle: Bundle) -> None:
    """Keep ``bundle`` for the next process (best effort: a read-only home only costs
    the time to make it again); the bundles of other sources are removed."""
    with contextlib.suppress(OSError, GpuwsError):
        folder = _bundle_dir()
        folder.mkdir(mode=0o700, exist_ok=True)
        name = f"{key}-{bundle.sha256}.pyz"
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        # 0600 like everything else under the data dir (a umask's 0644 let other users
        # read which agent this person deploys, and the test of the home's modes fails).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(bundle.data)
        os.replace(tmp, folder / name)
        for old in folder.glob("*.pyz"):
            if old.name != name:
                old.unlink(missing_ok=True)


def lean_source(source: bytes) -> bytes:
    """``source`` without its comments and docstrings, every other token where it was.

    The pod needs the agent's code; its comments and docstrings are for people reading
    the repository, and were a third of the bundle's bytes (204 -> 130 KB compressed
    when this was written). A docstring becomes ``""`` and the lines it spanned stay, as
    blank lines, so a traceback from the pod names the same line as the source.
    """
    import tokenize  # here: only a bundle being made needs it

    tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    cuts: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    before = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    prev = tokenize.ENCODING  # the last token that is neither a comment nor NL
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            cuts.append((tok.start, tok.end, ""))
            continue
        if tok.type == tokenize.STRING and prev in before:
            after = next((t for t in tokens[i + 1:i + 3] if t.type != tokenize.COMMENT), None)
            # A string that is a whole statement (a docstring, or a no-op): keep ``""``.
            if after is not None and after.type == tokenize.NEWLINE:
                cuts.append((tok.start, tok.end, '""'))
        if tok.type != tokenize.NL:
            prev = tok.type
    lines = source.decode("utf-8").splitlines(keepends=True)
    for (srow, scol), (erow, ecol), keep in reversed(cuts):
        first, last = lines[srow - 1], lines[erow - 1]
        if srow == erow:
            lines[srow - 1] = first[:scol] + keep + first[ecol:]
            continue
        lines[srow - 1] = first[:scol] + keep + "\n"
        for row in range(srow, erow - 1):
            lines[row] = "\n"
        lines[erow - 1] = last[ecol:]
    return "".join(lines).encode("utf-8")


# Stage 1, run as `python3 -c BOOTSTRAP SHA SIZE CMD...`. It must parse on old Pythons so
# that a too-old one can say so: no f-strings, no walrus. It reads the cache dir from
# GPUWS_POD_CACHE or ~/.cache/gpuws (creating it; exist_ok because several laptops may
# connect at once), refuses a cache dir owned by someone else or
# writable by others (a shared pod), starts the cached bundle if its sha256 matches, and
# otherwise asks for it ("need"/"corrupt"), reads exactly SIZE bytes from stdin with
# unbuffered os.read (a buffered read could swallow the agent's first request),
# verifies the hash, writes it atomically (temp + fsync + rename, mode 0600) and runs it
# in the same interpreter (runpy, as `python3 -S BUNDLE` would, but without starting a
# second interpreter: 66 -> 53 ms to Hello here). sys.path's "" (the current directory,
# which -c puts first) is dropped before anything is imported, so no file in the pod's
# home directory (where exec sessions start) can stand in for a module. The agent runs
# under -S too: `serve` is standard library only (tests/test_architecture.py runs it under
# -I -S), its probe reads site-packages from `site` and pyvenv.cfg itself, and workers
# start their own interpreter with the normal site, so CuPy/torch stay importable where
# workloads run. Skipping site saved 64 ms of a 593 ms bootstrap under load (a .pth file
# importing certifi).
_BOOT_HEAD = r"""
import sys
if sys.path[:1] == [""]:
    del sys.path[0]
import hashlib, os
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
        os.makedirs(p, 0o700, exist_ok=True)
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
"""
_BOOT_RECV_BYTES = r"""if digest(path) != sha:
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
"""
# The terminal variant of the receive step (a PTY carries text, not bytes). The bundle
# arrives as lines "OFFSET SHA256 BASE64" (each chunk checksummed), then a "GPUWS-SENT"
# line; only a chunk that starts exactly where the file ends and matches its checksum is
# kept, anything else (noise, a garbled or repeated line) is skipped. Kept chunks go to
# SHA.pyz.part, so a broken link resumes where it stopped: "need SHA OFFSET" asks for
# the rest, after every round that left a gap. The .part is locked (flock) because two
# laptops may connect at once; the whole file is verified before the atomic rename.
_BOOT_RECV_TEXT = r"""if digest(path) != sha:
    import binascii, fcntl
    state = "corrupt" if os.path.exists(path) else "need"
    part = path + ".part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    have = os.lseek(fd, 0, 2)
    if digest(path) == sha:
        have, state = size, "cached"
    elif have > size:
        os.ftruncate(fd, 0); have = 0
    buf = bytearray()
    rounds = 0
    while have < size:
        rounds += 1
        if rounds > 20:
            w("GPUWS-BOOT short %d\n" % have); sys.exit(4)
        w("GPUWS-BOOT %s %s %d\n" % (state, sha, have))
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > (1 << 22):
                    del buf[:]
                c = os.read(0, 1 << 16)
                if not c:
                    w("GPUWS-BOOT short %d\n" % have); sys.exit(4)
                buf += c
                continue
            f = bytes(buf[:nl]).split()
            del buf[:nl + 1]
            if f[-1:] == [b"GPUWS-SENT"]:
                break
            if len(f) != 3 or not f[0].isdigit() or int(f[0]) != have:
                continue
            try:
                data = binascii.a2b_base64(f[2])
            except (binascii.Error, ValueError):
                continue
            if have + len(data) <= size and hashlib.sha256(data).hexdigest().encode() == f[1]:
                os.write(fd, data)
                have += len(data)
    if digest(path) != sha:
        os.fsync(fd)
        if digest(part) != sha:
            os.close(fd); os.unlink(part)
            w("GPUWS-BOOT bad-hash\n"); sys.exit(5)
        os.replace(part, path)
    os.close(fd)
"""
_BOOT_TAIL = r"""w("GPUWS-BOOT start %s\n" % state)
sys.argv[:] = [path] + sys.argv[3:]
import runpy
runpy.run_path(path, run_name="__main__")
"""
BOOTSTRAP = (_BOOT_HEAD + _BOOT_RECV_BYTES + _BOOT_TAIL).strip()
#: The same stage 1 for a terminal (PTY) link: the bundle comes as checksummed text.
BOOTSTRAP_TEXT = (_BOOT_HEAD + _BOOT_RECV_TEXT + _BOOT_TAIL).strip()
#: Raw bytes per text chunk line of the bundle: a line stays under 4 KiB, so it would
#: survive even a terminal left in canonical mode (MAX_CANON is 4096 on Linux).
TEXT_CHUNK = 2400


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
    # -S: stage 1 needs only hashlib/os/sys; skipping site saves ~35 ms per connect. The
    # agent it execs runs under -S as well (see the notes on stage 1 above).
    return [python, "-S", "-c", BOOTSTRAP, bundle.sha256, str(bundle.size), *command]


def text_bootstrap_argv(bundle: Bundle, command: list[str],
                        python: str = "python3") -> list[str]:
    """Stage 1 for a terminal link: one short line of shell-safe characters.

    A shell reads it from a terminal, so the code travels compressed and base64-encoded:
    no quote, newline or ``$`` for any shell to interpret, and the whole command stays far
    below the 4 KiB a terminal in canonical mode accepts per line.
    """
    code = base64.b64encode(zlib.compress(BOOTSTRAP_TEXT.encode(), 9)).decode()
    # sys.path's "" goes first here too (see stage 1), before base64 and zlib are imported.
    loader = ("import sys;sys.path[0]or sys.path.pop(0);import base64,zlib;"
              f"exec(zlib.decompress(base64.b64decode('{code}')))")
    return [python, "-S", "-c", loader, bundle.sha256, str(bundle.size), *command]


def text_chunks(bundle: Bundle, offset: int) -> list[bytes]:
    """The bundle from ``offset`` as the text bootstrap reads it: checksummed base64 lines."""
    lines = []
    for pos in range(offset, bundle.size, TEXT_CHUNK):
        data = bundle.data[pos:pos + TEXT_CHUNK]
        lines.append(b"%d %s %s\n" % (pos, hashlib.sha256(data).hexdigest().encode(),
                                       base64.b64encode(data)))
    return lines


def agent_argv(bundle: Bundle, python: str = "python3") -> list[str]:
    """Start the cached bundle directly (used for side channels such as ``cat``).

    A relative path: exec channels start in the home directory. The ``sh -c`` wrapper is
    a fixed string; the arguments after it arrive as positional parameters, never parsed.
    """
    return ["sh", "-c", f'exec "$0" "{POD_CACHE}/agent/{bundle.sha256}.pyz" "$@"', python]


def serve_command(python: str) -> list[str]:
    """The agent's ``serve`` command; ``--python-given`` when the person named the pod's
    interpreter (``--python`` other than the default ``python3``): workloads then run under
    it and the agent looks for no other (``remote_agent/pod/pythons.py``). The default
    ``python3`` is the login PATH's, and the agent may find a better one for workloads."""
    return ["serve"] if python == "python3" else ["serve", "--python-given"]


async def start_agent(transport: Transport, *, python: str = "python3",
                      timeout: float = 60.0) -> tuple[RemoteProcess, DeployResult, bytes]:
    """Start ``serve`` on the pod, uploading the bundle only when the cache lacks it.

    Returns the running process, what happened, and any bytes already read past the
    Hello line (the start of the event stream). Over a terminal (``transport.info.kind``
    is ``pty``) the bundle goes as checksummed text lines (``BOOTSTRAP_TEXT``), and a
    frame is found even behind noise that a terminal put in front of it on its line.

    The bootstrap is the link's first command: when it fails on a pod that turns out
    to offer only a terminal (:meth:`Transport.switch_to_terminal`), it is started again
    that way. The transport's :attr:`~Transport.info` is final when this returns.
    """
    try:
        started = await _start_once(transport, python=python, timeout=timeout)
    except GpuwsError:
        if not await transport.switch_to_terminal():
            raise
        started = await _start_once(transport, python=python, timeout=timeout)
    await transport.settled()
    return started


async def _start_once(transport: Transport, *, python: str,
                      timeout: float) -> tuple[RemoteProcess, DeployResult, bytes]:
    bundle = build_bundle()
    text_mode = transport.info.kind == "pty"
    t0 = time.monotonic()
    argv = (text_bootstrap_argv if text_mode else bootstrap_argv)(bundle, serve_command(python),
                                                                   python)
    proc = await transport.start(argv)
    state = ""
    sent = 0
    rounds = 0
    buf = b""
    noise: deque[str] = deque(maxlen=5)
    try:
        async with asyncio.timeout(timeout):
            while True:
                chunk = await proc.stdout.read(65536)
                if not chunk:
                    await _explain_failure(proc, python, buf,
                                           "\n".join(noise) if text_mode else "")
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode("utf-8", "replace").strip()
                    if text_mode:
                        line, text = _behind_noise(line, text)
                    if text.startswith("GPUWS-BOOT "):
                        word = text.split()[1]
                        if word in ("need", "corrupt") and text_mode:
                            state = word
                            rounds += 1
                            if rounds > 10:
                                raise DeployError("the agent bundle did not get through the "
                                                  "terminal after 10 attempts",
                                                  remedy="check the link; connect again to "
                                                         "resume the upload")
                            have = int(text.split()[3])
                            for piece in text_chunks(bundle, have):
                                proc.stdin.write(piece)
                                await proc.stdin.drain()
                            proc.stdin.write(b"GPUWS-SENT\n")
                            await proc.stdin.drain()
                            sent += bundle.size - have
                        elif word in ("need", "corrupt"):
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
                    elif text:
                        # Anything else before the first frame (a login banner, MOTD) is
                        # noise; the last lines explain a failure over a terminal.
                        noise.append(text[-300:])
    except TimeoutError as exc:
        proc.close()
        raise DeployError(f"the agent did not start within {timeout:.0f} s",
                          remedy="check the pod's load and that python3 runs there") from exc
    except GpuwsError:
        proc.close()
        # The bootstrap has exited or is about to: reap it so a local one never lingers.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    except BaseException:
        proc.close()
        raise


def _behind_noise(line: bytes, text: str) -> tuple[bytes, str]:
    """A bootstrap line or the Hello frame, even with terminal noise in front of it."""
    for mark in ("GPUWS-BOOT ", '{"type":'):
        at = text.find(mark)
        if at > 0:
            raw = line.find(mark.encode())
            return line[raw:].strip(), text[at:]
    return line.strip(), text


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


async def _explain_failure(proc: RemoteProcess, python: str, seen: bytes,
                           merged: str = "") -> None:
    """Why the bootstrap ended; ``merged`` is the output of a terminal, where stderr and
    stdout are one stream (so the shell's complaint is there, not on stderr)."""
    err = (await proc.stderr.read()).decode("utf-8", "replace").strip() or merged
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
