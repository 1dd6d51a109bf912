#!/usr/bin/env bash
# The slotlake demo: installs what is missing (scripts/setup.sh), then starts a throw-away PostgreSQL with a small
# shop, syncs it twice into a Delta lake under .demo/ through `airflow dags test`, and shows what landed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "$root/.venv/bin/python" "$root/scripts/demo.py" "$@"
