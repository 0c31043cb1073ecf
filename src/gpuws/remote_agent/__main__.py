"""Agent entry point: ``python3 agent.pyz COMMAND``.

Commands: ``serve`` (request loop on stdin/stdout), ``worker RUN_ID`` (a detached run),
``child MODE RUN_ID`` (a workload process under a tier), ``forkserver SOCKET WORK_DIR
LIFELINE_FD READY_FD`` (watch's pre-imported parent of Tier-1 children), ``cat PATH
OFFSET`` (stream a run file to stdout: the exec-channel file transfer), ``cat64 PATH
OFFSET [CHUNK]`` (the same as checksummed base64 text frames, for a terminal link),
``probe`` (print the probe as JSON).
"""

from __future__ import annotations

import json
import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args[0] if args else "serve"
    if cmd == "serve":
        from .serve import main as serve_main

        # Whether the laptop named this interpreter (--python): workloads then run under it
        # and no other is looked for (pythons.GIVEN_ENV; the workers serve starts inherit
        # it). Set or cleared here, so only what this serve was told counts.
        if args[1:] == ["--python-given"]:
            os.environ["GPUWS_PYTHON_GIVEN"] = "1"
        else:
            os.environ.pop("GPUWS_PYTHON_GIVEN", None)
        return serve_main()
    if cmd == "worker" and len(args) == 2:
        from .worker import main as worker_main

        return worker_main(args[1])
    if cmd == "child" and len(args) >= 3:
        from .child import main as child_main

        return child_main(args[1], args[2], args[3:])
    if cmd == "forkserver" and len(args) == 5:
        from .forkserver import main as forkserver_main

        return forkserver_main(args[1:])
    if cmd == "lease" and len(args) == 1:
        from .lease import main as lease_main

        return lease_main()
    if cmd == "cat" and len(args) == 3:
        return cat(args[1], int(args[2]))
    if cmd == "cat64" and len(args) in (3, 4):
        return cat64(args[1], int(args[2]), int(args[3]) if len(args) == 4 else 1 << 18)
    if cmd == "probe":
        from .pod.probe import probe

        sys.stdout.write(json.dumps(probe(), indent=2) + "\n")
        return 0
    sys.stderr.write("usage: agent serve | worker RUN_ID | lease | cat PATH OFFSET | "
                     "cat64 PATH OFFSET [CHUNK] | probe\n")
    return 2


def cat(path: str, offset: int) -> int:
    from .safefiles import open_regular
    from .serve import safe_path

    try:
        fd, st = open_regular(safe_path(path))
    except (OSError, ValueError) as exc:
        sys.stderr.write("gpuws-agent: %s\n" % exc)
        return 1
    out = sys.stdout.buffer
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        # Up to the size when opened: a file the workload keeps growing must not make
        # this transfer endless (the laptop asks again from where it stopped).
        left = st.st_size - offset
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        out.flush()
    finally:
        os.close(fd)
    return 0


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def cat64(path: str, offset: int, chunk: int) -> int:
    """Stream a run file from ``offset`` as text a terminal cannot mangle.

    One line per chunk: ``GPWS-CAT OFFSET LENGTH SHA256 ENC DATA`` where DATA is the
    chunk in base64 (ENC ``b64``) or zlib-compressed then base64 (``z64``, when that is
    at least 10% smaller: reports and logs shrink three- to fourfold, which is what a
    slow terminal link needs), then ``GPWS-END END_OFFSET SHA256`` where that digest
    covers every byte sent (offset to end), or ``GPWS-ERR MESSAGE``. Each line goes out
    in a single write, so anything else that writes to the terminal lands between lines,
    never inside one; the reader skips such noise and resumes from the last good offset
    when a chunk is lost or garbled.
    """
    import base64
    import hashlib
    import zlib

    from .safefiles import open_regular
    from .serve import safe_path

    try:
        fd, st = open_regular(safe_path(path))
    except (OSError, ValueError) as exc:
        _write_all(("GPWS-ERR %s\n" % exc).encode("ascii", "replace"))
        return 1
    end = st.st_size  # the size when opened: a growing file must not stream forever
    whole = hashlib.sha256()
    pos = offset
    skip = 0  # chunks to send without trying compression (after a sample that did not shrink)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while True:
            parts = []
            want = min(chunk, end - pos)
            while want > 0:  # a full chunk, unless the file ends
                got = os.read(fd, want)
                if not got:
                    break
                parts.append(got)
                want -= len(got)
            data = b"".join(parts)
            if not data:
                break
            whole.update(data)
            enc, payload = b"b64", data
            if skip:
                skip -= 1
            elif len(zlib.compress(data[:16384], 1)) < 0.8 * min(len(data), 16384):
                # (a sample first: compressing packed data costs much and gains nothing)
                packed = zlib.compress(data, 1)
                if len(packed) < 0.9 * len(data):
                    enc, payload = b"z64", packed
            else:
                skip = 8  # incompressible (already packed): look again a few chunks on
            _write_all(b"GPWS-CAT %d %d %s %s %s\n" % (
                pos, len(data), hashlib.sha256(data).hexdigest().encode(), enc,
                base64.b64encode(payload)))
            pos += len(data)
    except OSError as exc:
        _write_all(("GPWS-ERR reading %s at byte %d: %s\n" % (path, pos, exc)).encode(
            "ascii", "replace"))
        return 1
    finally:
        os.close(fd)
    _write_all(b"GPWS-END %d %s\n" % (pos, whole.hexdigest().encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
