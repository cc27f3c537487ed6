#!/usr/bin/env bash
# A Python venv with the client driver (psycopg 3 from PyPI) and the
# property-testing library, for the stress driver, fuzz tests and examples.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

PY_PACKAGES=("psycopg[binary]==3.2.*" "hypothesis==6.*")
if [ ! -x "$IDEM_PY" ]; then
  say "creating the Python venv in $IDEM_VENV"
  python3 -m venv "$IDEM_VENV"
fi
if ! "$IDEM_PY" -c "import psycopg, hypothesis" 2>/dev/null; then
  say "installing Python packages: ${PY_PACKAGES[*]}"
  "$IDEM_PY" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
