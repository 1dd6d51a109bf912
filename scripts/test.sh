#!/usr/bin/env bash
# The test suite: installs what is missing (scripts/setup.sh), then runs pytest from the repo's .venv.
# Extra arguments go to pytest (e.g. scripts/test.sh -m unit, scripts/test.sh tests/integration/test_cli.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 5
fi
exit "$rc"
