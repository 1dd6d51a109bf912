#!/usr/bin/env bash
# Builds Docker Compose v2 (the `docker compose` CLI plugin) from its Go module on the Go module proxy into
# .tools/compose-<version>/docker-compose, for tests/integration/test_docker_compose.py, which runs
# `docker compose config` on docker/compose.yaml (`config` needs the docker CLI and this plugin, not an engine).
# No package of this machine's registries ships Compose v2 (Debian 12 has only the Python 1.29, which refuses the
# file's top-level `name:`), so it is built from source. Idempotent and locked: a second call waits for a running
# build, then returns at once. `--background` (.ci/run, scripts/test.sh) starts the build detached and nice'd, logging to
# .tools/build-compose.log, and returns: it takes minutes of CPU, which the test suite's idle moments absorb.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="v2.40.3"
dir="$root/.tools/compose-$version"
out="$dir/docker-compose"
mkdir -p "$dir"
[ -x "$out" ] && exit 0
if [ "${1:-}" = "--background" ]; then
  echo "build-compose: building docker compose $version in the background (log: .tools/build-compose.log)"
  nohup nice -n 10 "$0" >> "$root/.tools/build-compose.log" 2>&1 < /dev/null &
  exit 0
fi
exec 9>"$dir/.lock"
flock 9
[ -x "$out" ] && exit 0
go="$(command -v go || true)"
[ -n "$go" ] || go=/usr/local/go/bin/go
[ -x "$go" ] || { echo "build-compose: Go not found (PATH or /usr/local/go); install Go 1.24+ to build docker compose" >&2; exit 1; }
start=$(date +%s)
src="$("$go" mod download -json "github.com/docker/compose/v2@$version" |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/"
chmod -R u+w "$work"
(cd "$work" && GOFLAGS=-mod=mod "$go" build -trimpath \
   -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$version" -o "$out.tmp" ./cmd)
mv "$out.tmp" "$out"
echo "build-compose: docker compose $version built in $(( $(date +%s) - start )) s: $out"
