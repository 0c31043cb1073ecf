"""The architecture, enforced: the agent is stdlib-only, the core never imports textual."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path

import pytest

from gpuws import deploy

CORE = ["gpuws.protocol", "gpuws.transport", "gpuws.transport.ssh", "gpuws.deploy",
        "gpuws.client", "gpuws.sessions.store", "gpuws.sessions.export", "gpuws.sessions.compare",
        "gpuws.cli", "gpuws.commands.doctor", "gpuws.live.watchloop", "gpuws.commands.watch"]


@pytest.mark.parametrize("module", CORE)
def test_core_never_imports_textual(module: str) -> None:
    code = f"import sys, {module}; sys.exit(1 if 'textual' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, module


def test_agent_bundle_runs_on_the_bare_standard_library(tmp_path: Path) -> None:
    """`python3 -I -S` has no site-packages: only the stdlib and the bundle itself."""
    bundle = tmp_path / "agent.pyz"
    bundle.write_bytes(deploy.build_bundle().data)
    env = {"GPUWS_POD_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-I", "-S", str(bundle), "probe"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert '"hostname"' in probe.stdout
    # Every module in the bundle imports without site-packages.
    names = [n[:-3].replace("/", ".") for n in zipfile.ZipFile(bundle).namelist()
             if n.startswith("gpuws/") and n.endswith(".py") and not n.endswith("__main__.py")]
    code = ("import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('msgspec','asyncssh','textual','rich','cupy','torch','numpy')]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(bundle)!r})\n" + code, *names],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr


def test_bundle_is_deterministic_and_small() -> None:
    deploy.build_bundle.cache_clear()
    a = deploy.build_bundle()
    shutil.rmtree(deploy._bundle_dir())  # made again, not read back
    deploy.build_bundle.cache_clear()
    b = deploy.build_bundle()
    assert a.data == b.data and a.sha256 == b.sha256
    assert a.size <= 200_000


def _code_tokens(source: bytes) -> list[tuple[int, str, tuple[int, int]]]:
    """Every token but comments, blank lines and line ends (a line's end moves where a
    comment or a docstring before it went; the next token's place still says the line)."""
    return [(t.type, t.string, t.start) for t in tokenize.tokenize(io.BytesIO(source).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]


def test_the_bundle_carries_every_line_of_code_where_it_was() -> None:
    """Comments and docstrings stay home; every other token keeps its line and column,
    so a traceback from the pod names the source's line."""
    src = Path(deploy.__file__).parent
    paths = sorted([*(src / "remote_agent").rglob("*.py"), *(src / "kernels").rglob("*.py")])
    stripped = 0
    for path in paths:
        raw = path.read_bytes()
        lean = deploy.lean_source(raw)
        compile(lean, str(path), "exec")
        before, after = _code_tokens(raw), _code_tokens(lean)
        assert len(before) == len(after), path
        for b, a in zip(before, after, strict=True):
            if b != a:  # only a docstring (a string alone as a statement) became ""
                assert (a[0], a[1], a[2]) == (tokenize.STRING, '""', b[2]), (path, b, a)
                stripped += 1
        assert lean.count(b"\n") == raw.count(b"\n"), path
        assert not [t for t in tokenize.tokenize(io.BytesIO(lean).readline)
                    if t.type == tokenize.COMMENT], path
    assert stripped > 100  # the docstrings went


def test_a_damaged_kept_bundle_is_made_again() -> None:
    deploy.build_bundle.cache_clear()
    good = deploy.build_bundle()
    (kept,) = deploy._bundle_dir().glob("*.pyz")
    kept.write_bytes(good.data[:1000])  # cut short (a full disk, a crash mid-write)
    deploy.build_bundle.cache_clear()
    again = deploy.build_bundle()
    assert again == good
    deploy.build_bundle.cache_clear()
    assert deploy.build_bundle() == good and kept.read_bytes() == good.data
