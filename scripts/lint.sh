#!/usr/bin/env bash
# Static checks, run by .ci/run before the tests: ruff (style and bug patterns), mypy (types of the package) and
# import-linter (the layering contracts in pyproject.toml, see docs/architecture.md). Needs .venv (scripts/setup.sh).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rc=0
echo "lint: ruff check"
.venv/bin/ruff check --output-format concise . || rc=1
echo "lint: mypy"
.venv/bin/mypy || rc=1
echo "lint: lint-imports (pyproject.toml [tool.importlinter])"
out="$(.venv/bin/lint-imports --no-cache 2>&1)" || rc=1
sed -n '/^Contracts$/,$p' <<<"$out" | grep -vE '^-+$|^$'
if [ "$rc" -eq 0 ]; then echo "lint: all checks passed"; else echo "lint: FAILED (see above)"; fi
exit "$rc"
