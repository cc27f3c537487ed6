#!/usr/bin/env bash
# Install everything idem needs on Debian 12 (as root), then build and
# install the extension into the system PostgreSQL 15. Safe to run again:
# each step is skipped when already done.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron postgresql-15-plproxy
          libclang-dev clang sudo libipc-run-perl build-essential pkg-config
          python3-venv python3-pip)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  say "installing cargo-pgrx $PGRX_VERSION (takes about 6 minutes, once)"
  cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

if ! grep -qs "pg15" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
  say "pointing pgrx at PostgreSQL 15"
  cargo pgrx init --pg15 "$PG_CONFIG" >/dev/null
fi

# Each area's own tools (language drivers, toolchains): scripts/setup.d/*.sh,
# in name order, each idempotent.
for step in "$ROOT"/scripts/setup.d/*.sh; do
  [ -e "$step" ] && bash "$step"
done

say "building and installing the extension"
cd "$ROOT"
cargo pgrx install --release --pg-config "$PG_CONFIG" 2>&1 | grep -E "^error|^warning|Finished installing" || true
test -f "$($PG_CONFIG --pkglibdir)/idem.so" || { echo "idem.so was not installed" >&2; exit 1; }
