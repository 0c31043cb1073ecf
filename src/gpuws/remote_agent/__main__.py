"""Agent entry point: ``python3 agent.pyz COMMAND``.

Commands: ``serve`` (request loop on stdin/stdout), ``worker RUN_ID`` (a detached run),
``child MODE RUN_ID`` (a workload process under a tier), ``cat PATH OFFSET`` (stream a
run file to stdout: the exec-channel file transfer), ``probe`` (print the probe as JSON).
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

        return serve_main()
    if cmd == "worker" and len(args) == 2:
        from .worker import main as worker_main

        return worker_main(args[1])
    if cmd == "child" and len(args) >= 3:
        from .child import main as child_main

        return child_main(args[1], args[2], args[3:])
    if cmd == "cat" and len(args) == 3:
        return cat(args[1], int(args[2]))
    if cmd == "probe":
        from .probe import probe

        sys.stdout.write(json.dumps(probe(), indent=2) + "\n")
        return 0
    sys.stderr.write("usage: agent serve | worker RUN_ID | cat PATH OFFSET | probe\n")
    return 2


def cat(path: str, offset: int) -> int:
    from .serve import safe_path

    try:
        real = safe_path(path)
        fd = os.open(real, os.O_RDONLY)
    except (OSError, ValueError) as exc:
        sys.stderr.write("gpuws-agent: %s\n" % exc)
        return 1
    out = sys.stdout.buffer
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            out.write(chunk)
        out.flush()
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
