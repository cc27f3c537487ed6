#!/usr/bin/env bash
# What tests/scenarios/middleware_go.sh needs: a Go toolchain (GO_MIN or
# newer, tests/lib/go.sh) and the modules of the Go client (clients/go:
# pgx) and of its test servers (clients/go/test: chi, echo, gin), downloaded
# from the Go module proxy once into /var/cache/idem/go/mod, so that the
# scenario builds offline (GOPROXY=off). A machine without a new enough Go
# gets Debian's (1.19), which only fetches the toolchain module that the go
# command itself would take from the proxy; that one is used from then on.
# Skipped when the cache already holds what both go.sum files name.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
source "$ROOT/tests/lib/go.sh"

go_env online
if ! go_new_enough; then
  if ! command -v go >/dev/null; then
    say "installing Debian's Go, to fetch a newer toolchain with"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
  fi
  say "fetching the Go toolchain module golang.org/toolchain@$GO_TOOLCHAIN from the Go module proxy"
  mkdir -p "$GO_CACHE_DIR"
  dir=$(cd /tmp && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "golang.org/toolchain@$GO_TOOLCHAIN" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] && [ -f "$dir/bin/go" ] || { echo "the toolchain module did not unpack" >&2; exit 1; }
  # (the module cache is read-only and keeps no execute bits; the go
  # command sets them the same way when it switches toolchains)
  chmod -R u+w "$dir" && chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
  echo "$dir" > "$GO_CACHE_DIR/goroot"
  go_env online
  go_new_enough || { echo "the toolchain in $dir is not Go $GO_MIN or newer" >&2; exit 1; }
fi

stamp="$GO_CACHE_DIR/.complete-$(cat "$ROOT/clients/go/go.sum" "$ROOT/clients/go/test/go.sum" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "downloading the Go client's modules (pgx, chi, echo, gin) into $GO_CACHE_DIR/mod"
  (cd "$ROOT/clients/go" && go mod download)
  (cd "$ROOT/clients/go/test" && go mod download)
  touch "$stamp"
fi
