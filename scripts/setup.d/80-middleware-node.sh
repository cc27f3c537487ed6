#!/usr/bin/env bash
# For tests/scenarios/middleware_node.sh: the npm packages a user's project
# installs next to idem-pg (express, fastify, pg, and typescript with the
# types for the .d.ts check; clients/node/test/package.json), fetched once
# into npm's cache, so that the scenario's `npm install --prefer-offline`
# in a fresh folder needs no network. Node.js and npm come from
# 30-examples.sh, PgBouncer from 50-pgbouncer.sh. Skipped when the cache
# already holds what that package.json asks for.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

spec="$ROOT/clients/node/test/package.json"
stamp_dir=/var/cache/idem/middleware-node
stamp="$stamp_dir/$(sha256sum "$spec" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "filling npm's cache for the Node middleware test (express, fastify, pg, typescript)"
  scratch=$(mktemp -d /tmp/middleware-node-setup.XXXXXX)
  cp "$spec" "$scratch/package.json"
  (cd "$scratch" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
  rm -rf "$scratch"
  mkdir -p "$stamp_dir"
  touch "$stamp"
fi
