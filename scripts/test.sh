#!/usr/bin/env bash
# The test suite: installs what is missing (scripts/setup.sh), then runs pytest from the repo's .venv.
# Extra arguments go to pytest (e.g. scripts/test.sh -m unit, scripts/test.sh tests/integration/test_cli.py).
# Runs on $SLOTLAKE_TEST_WORKERS (default 2) pytest-xdist workers; 0 runs everything in one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
# docker compose v2 for tests/integration/test_docker_compose.py (`docker compose config` of docker/), built once
# per checkout from the Go module proxy (scripts/build-compose.sh): in the background, nice'd; the test waits for it.
scripts/build-compose.sh --background
set +e
# Two workers (pytest-xdist), whole files per worker: the long files wait on real clocks, a scheduler and JVM
# starts much of the time, so a second worker fills that time. SLOTLAKE_TEST_WORKERS=0 runs in one process.
workers="${SLOTLAKE_TEST_WORKERS:-2}"
if [ "$workers" = "0" ]; then
  .venv/bin/pytest "$@"
else
  # --no-loadscope-reorder: keep the collection order (longest files first, tests/conftest.py), not "most tests first".
  .venv/bin/pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 5
fi
exit "$rc"
