# Shared by scripts/run and scripts/test: the system packages and the virtualenv.
# Sourced, not executed. Installs only what is missing (apt on Debian/Ubuntu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

apt_install() {
  if [ "$#" -eq 0 ]; then return 0; fi
  if ! command -v apt-get >/dev/null; then
    echo "gpuws: please install: $*" >&2; exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "gpuws needs Python 3.11 or newer (found: $("$PY" -V 2>&1))" >&2; exit 1
fi

# ensure_venv EXTRA: .venv holds gpuws (editable, from this checkout) with EXTRA's packages.
# pip runs only when pyproject.toml or the extra changed since the last install (the
# stamp records both): a start with nothing to install takes no network and no pip
# (~2 s less, and it works offline; pip's build isolation would fetch hatchling).
ensure_venv() {
  if [ ! -x .venv/bin/python ]; then
    # Debian/Ubuntu split venv/ensurepip into python3-venv.
    "$PY" -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
    "$PY" -m venv .venv
  fi
  local stamp=.venv/.gpuws-installed want have=""
  want="$1 $(sha256sum pyproject.toml | cut -d' ' -f1)"
  [ -f "$stamp" ] && have=$(cat "$stamp")
  # A stamp for "dev" covers "report" and "report,mcp" too: dev's extras include ncu-report
  # and mcp.
  case "$have" in
    "$want"|"dev $(sha256sum pyproject.toml | cut -d' ' -f1)")
      if .venv/bin/python -c 'import gpuws' 2>/dev/null; then return 0; fi ;;
  esac
  .venv/bin/python -m pip install -q -e ".[$1]"
  echo "$want" > "$stamp"
}
