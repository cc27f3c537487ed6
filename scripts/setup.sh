#!/usr/bin/env bash
# Install everything idem needs on Debian 12 (as root), then build and
# install the extension into the system PostgreSQL 15. Safe to run again:
# each step is skipped when already done.
# Another PostgreSQL: PG_CONFIG=/path/to/pg_config bash scripts/setup.sh
# (see lib.sh). A Debian-packaged one (/usr/lib/postgresql/NN/bin/pg_config)
# gets its packages from apt; for any other, the version-specific packages
# are skipped (the server, its headers, pg_cron and PL/Proxy come with it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(libclang-dev clang sudo libipc-run-perl build-essential pkg-config
          python3-venv python3-pip)
if [ "$PG_DEBIAN" = 1 ]; then
  PACKAGES=("postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" "postgresql-$PG_MAJOR-cron"
            "postgresql-$PG_MAJOR-plproxy" "${PACKAGES[@]}")
fi
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

# `cargo pgrx init` rewrites config.toml with just the versions it is given:
# pass every version already configured (whose pg_config still exists) too.
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
if ! grep -qsxF "pg$PG_MAJOR = \"$PG_CONFIG\"" "$pgrx_config"; then
  init_args=()
  while IFS= read -r line; do
    if [[ "$line" =~ ^pg([0-9]+)\ =\ \"(.*)\"$ ]] && [ "${BASH_REMATCH[1]}" != "$PG_MAJOR" ]; then
      if [ -x "${BASH_REMATCH[2]}" ]; then init_args+=("--pg${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}")
      else echo "dropping pg${BASH_REMATCH[1]} from $pgrx_config: ${BASH_REMATCH[2]} is gone" >&2; fi
    fi
  done < <(cat "$pgrx_config" 2>/dev/null || true)
  say "pointing pgrx at PostgreSQL $PG_MAJOR ($PG_CONFIG)"
  cargo pgrx init "${init_args[@]}" "--pg$PG_MAJOR" "$PG_CONFIG" >/dev/null
fi

# Each area's own tools (language drivers, toolchains): scripts/setup.d/*.sh,
# in name order, each idempotent. The core suite that runs on the other
# majors (scripts/test.sh, IDEM_SUITE=core) needs only Python and ps.
for step in "$ROOT"/scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  if [ "${IDEM_SUITE:-full}" = core ] && [[ ! "$(basename "$step")" =~ ^(10-python|20-stress) ]]; then continue; fi
  bash "$step"
done

say "building and installing the extension"
cd "$ROOT"
cargo pgrx install --release --pg-config "$PG_CONFIG" "${PG_FEATURE_ARGS[@]}" 2>&1 | grep -E "^error|^warning|Finished installing" || true
test -f "$($PG_CONFIG --pkglibdir)/idem.so" || { echo "idem.so was not installed" >&2; exit 1; }
