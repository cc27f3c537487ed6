# The Go toolchain and module cache of the Go client's test (source it
# after scripts/lib.sh): scripts/setup.sh --tool middleware_go fills the
# cache from the Go module proxy; tests/scenarios/clients.sh middleware_go builds
# offline from it.
#   go_env [online]   exports GOROOT's PATH, GOMODCACHE, GOCACHE and, unless
#                     "online", GOPROXY=off (every module must be cached)
GO_CACHE_DIR=/var/cache/idem/go
GO_MIN=1.25   # clients/go/go.mod's go line
# Where a machine without Go (or with an older one, as Debian 12's 1.19)
# gets one: the toolchain module the go command itself would take from the
# Go module proxy (golang.org/toolchain), unpacked in the module cache.
GO_TOOLCHAIN=v0.0.1-go1.26.8.linux-amd64

go_env() {
  local goroot
  if [ -f "$GO_CACHE_DIR/goroot" ]; then
    goroot=$(cat "$GO_CACHE_DIR/goroot")
    PATH="$goroot/bin:$PATH"
  elif ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
    PATH="/usr/local/go/bin:$PATH"
  fi
  export PATH GOMODCACHE="$GO_CACHE_DIR/mod" GOCACHE="$GO_CACHE_DIR/build" GOTOOLCHAIN=local GOFLAGS=-mod=readonly
  if [ "${1:-}" = online ]; then
    export GOPROXY=https://proxy.golang.org GOFLAGS=-mod=mod
  else
    export GOPROXY=off
  fi
}

# go_new_enough: the go on PATH is GO_MIN or newer.
go_new_enough() {
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//') || return 1
  [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | head -1)" = "$GO_MIN" ]
}
