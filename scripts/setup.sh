#!/usr/bin/env bash
# Installs everything slotlake needs on a Debian machine, idempotently:
#   - Debian packages: the PostgreSQL server (initdb/pg_ctl), Java 17, Maven, Chromium and its chromedriver
#     for the browser tests (only those missing)
#   - .venv/ at the repo root with the pinned requirements and slotlake itself (editable, all extras)
#   - the Delta jars from Maven Central into .jars/ (spark.jars points there; Spark never downloads at start),
#     and the S3 jars (hadoop-aws, the AWS SDK bundle) into .jars/s3/ (used only for an s3a:// lake)
#   - the Spark driver's class-data-sharing archive into .jars/cds/ (slotlake.spark.cds; built once per Java and jars)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need_pkgs=()
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
[ -n "$(pg_bin)" ] && [ -x "$(pg_bin)/initdb" ] || need_pkgs+=(postgresql postgresql-contrib)
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_pkgs+=(maven)
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3 python3-venv)
# The browser tests (tests/ui) drive Debian's headless Chromium through its chromedriver: nothing downloads a browser.
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_pkgs+=(chromium-driver)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
# Debian's postgresql package starts a cluster of its own; slotlake never uses it (tests and demo initdb their own).

# The jars resolve (Maven, mostly network) while pip installs .venv (mostly network and unpacking): both at once.
resolve_jars() {
  jar_stamp="$(sha256sum jars/pom.xml | cut -c1-16)"
  if [ "$(cat .jars/.stamp 2>/dev/null)" != "$jar_stamp" ]; then
    echo "setup: resolving Delta jars from Maven Central into .jars/"
    rm -rf .jars && mkdir -p .jars
    mvn -q -B -f jars/pom.xml dependency:copy-dependencies -DoutputDirectory="$root/.jars" -DincludeScope=runtime
    echo "$jar_stamp" > .jars/.stamp
  fi
  # The S3 jars (hadoop-aws and what it needs, jars/s3/pom.xml) in .jars/s3/: Spark loads them only for an s3a lake.
  s3_stamp="$(sha256sum jars/s3/pom.xml | cut -c1-16)"
  if [ "$(cat .jars/s3/.stamp 2>/dev/null)" != "$s3_stamp" ]; then
    echo "setup: resolving the S3 jars (hadoop-aws, AWS SDK bundle) from Maven Central into .jars/s3/"
    rm -rf .jars/s3 && mkdir -p .jars/s3
    mvn -q -B -f jars/s3/pom.xml dependency:copy-dependencies -DoutputDirectory="$root/.jars/s3" -DincludeScope=runtime
    echo "$s3_stamp" > .jars/s3/.stamp
  fi
}
jars_log="$(mktemp)"
resolve_jars > "$jars_log" 2>&1 &
jars_pid=$!

stamp_src="$(cat requirements.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.slotlake-stamp 2>/dev/null)" != "$stamp_src" ]; then
  echo "setup: creating .venv with pinned requirements"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  # slotlake itself, editable, with every extra; requirements.txt as constraints: installs nothing new, and fails
  # if a pin falls outside a range pyproject.toml declares.
  .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation -c requirements.txt \
    -e ".[spark,airflow,s3,test,lint]"
  echo "$stamp_src" > .venv/.slotlake-stamp
fi

if ! wait "$jars_pid"; then
  cat "$jars_log" >&2; rm -f "$jars_log"
  echo "setup: resolving the jars from Maven Central failed (above); check the network to repo.maven.apache.org and rerun" >&2
  exit 1
fi
cat "$jars_log"; rm -f "$jars_log"
ls .jars/*.jar .jars/s3/hadoop-aws-*.jar >/dev/null
# The class-data-sharing archive of the Spark driver JVM (slotlake.spark.cds: ~4 s less per JVM start), built once
# per Java, pyspark and jar set into .jars/cds/ by a JVM running a small Delta workload (~40 s). Optional: without it
# Spark loads its classes from the jars as before.
# Nothing to do when this Java's archive exists (it says "already built").
PYTHONPATH="$root/plugins" SPARK_CONF_DIR= .venv/bin/python -m slotlake.spark.cds ||
  echo "setup: no class-data-sharing archive; Spark runs without it (see the line above)"
