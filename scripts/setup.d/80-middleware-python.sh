#!/usr/bin/env bash
# What tests/scenarios/middleware_python.sh needs: the wheels of the web
# frameworks the idem-http package integrates with (FastAPI, Starlette,
# uvicorn, Django, SQLAlchemy), of its client (httpx), of psycopg 3 and of
# the build backend (setuptools), downloaded from PyPI once into a local
# wheelhouse. The scenario then builds idem-http's wheel and installs it,
# with these, into a fresh venv of its own, offline (pip --no-index
# --find-links), exactly as a user's `pip install` would.
# Skipped when the wheelhouse already holds every requirement.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

MW_WHEELHOUSE="$ROOT/.venv-wheels$IDEM_OS_SUFFIX/middleware-python"
MW_REQUIREMENTS=("psycopg[binary]==3.2.*" "psycopg-pool==3.2.*" "fastapi==0.115.*" "starlette" "uvicorn==0.32.*"
                 "Django==5.1.*" "SQLAlchemy==2.0.*" "httpx==0.27.*"
                 "setuptools>=69" "wheel" "build==1.2.*" "mypy==1.13.*")
stamp="$MW_WHEELHOUSE/.complete-$(printf '%s\n' "${MW_REQUIREMENTS[@]}" | md5sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  say "downloading the middleware scenario's wheels into $MW_WHEELHOUSE"
  mkdir -p "$MW_WHEELHOUSE"
  # (the project venv's pip: 10-python.sh made it; Debian's python3 may have none)
  "$IDEM_PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
    -d "$MW_WHEELHOUSE" "${MW_REQUIREMENTS[@]}"
  touch "$stamp"
fi
