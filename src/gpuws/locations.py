"""Every path gpuws uses on the laptop, in one place.

``GPUWS_HOME`` overrides the data directory and ``GPUWS_CONFIG`` the config file, so tests
(and people who want a second, separate history) stay hermetic. Directories gpuws creates
are private (0700): the store holds hostnames, probes and profiling reports.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from gpuws.errors import StoreError

APP_NAME = "gpuws"
DB_NAME = "sessions.db"
CONFIG_NAME = "config.toml"


def gpuws_home() -> Path:
    """The data directory (created 0700 if missing).

    Returns:
        ``$GPUWS_HOME`` when set, else the platform's user data dir for gpuws.
    """
    override = os.environ.get("GPUWS_HOME")
    home = Path(override).expanduser() if override else Path(platformdirs.user_data_dir(APP_NAME))
    ensure_private_dir(home)
    return home


def db_path() -> Path:
    """The session store's SQLite file (its directory is created, the file is not)."""
    return gpuws_home() / DB_NAME


def artifacts_dir(session_id: str, run_id: str) -> Path:
    """Where a run's pulled artifacts live (created 0700 if missing).

    Args:
        session_id: the session the run belongs to.
        run_id: the run (ids come from the pod, so they are checked to be one plain name).

    Raises:
        StoreError: an id is empty or would step outside the artifacts directory.
    """
    path = gpuws_home() / "artifacts" / _component(session_id) / _component(run_id)
    ensure_private_dir(path)
    return path


def config_path() -> Path:
    """The config file: ``$GPUWS_CONFIG`` when set, else ``<user config dir>/config.toml``.

    Nothing is created: reading a config must not leave directories behind.
    """
    override = os.environ.get("GPUWS_CONFIG")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir(APP_NAME)) / CONFIG_NAME


def _component(name: str) -> str:
    # Run ids arrive from the pod: never let one name a path outside our tree.
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise StoreError(f"{name!r} cannot be used as a directory name")
    return name


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents with mode 0700 (existing ones are left alone)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
            # mkdir's mode is masked by the umask; chmod makes 0700 exact.
            directory.chmod(0o700)
        except FileExistsError:
            continue  # another process made it between our check and mkdir
        except OSError as exc:
            raise StoreError(
                f"cannot create {directory}: {exc.strerror or exc}",
                remedy="set GPUWS_HOME to a writable directory",
            ) from exc
