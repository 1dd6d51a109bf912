"""A throw-away local PostgreSQL server for the tests and the demo (Debian's server binaries).

`initdb` into a fresh directory with `wal_level=logical`, start on a free port on 127.0.0.1, stop and delete
on close. PostgreSQL refuses to run as root, so as root the server runs as the `postgres` OS user.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bindir() -> Path:
    """The newest installed PostgreSQL server's bin directory (`PG_BINDIR` overrides)."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("no PostgreSQL server found under /usr/lib/postgresql; run scripts/setup.sh "
                           "(it installs Debian's postgresql package)")
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """Start with `LocalPostgres().start()`; `dsn(db)` for connections; `stop()` removes everything."""

    def __init__(self, base_dir: str | None = None, settings: dict[str, str] | None = None) -> None:
        self.bindir = pg_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="slotlake-pg-", dir=base_dir))
        self.data = self.dir / "data"
        self.port = free_port()
        self.settings = {
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.dir}'",
            "fsync": "off",  # throw-away server: speed over crash safety
            "synchronous_commit": "on",  # decoding reads only flushed WAL; with fsync off this costs little
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "256MB",
            "max_wal_size": "4GB",
            "logical_decoding_work_mem": "64MB",
        }
        self.settings.update(settings or {})
        self._as_postgres = os.geteuid() == 0
        self.user = "postgres" if self._as_postgres else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        if self._as_postgres:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, check=True, capture_output=True, text=True, **kw)

    def start(self) -> LocalPostgres:
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir, 0o700)
        self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                   "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# slotlake test server\n")
            f.write(f"port = {self.port}\n")
            for k, v in self.settings.items():
                f.write(f"{k} = {v}\n")
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
                   "-w", "-t", "60", "start"])
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL did not start; see {self.dir}/server.log")

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        return f"postgresql://{user or self.user}@127.0.0.1:{self.port}/{dbname}"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        out = subprocess.run([str(self.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
                              "-d", self.dsn(dbname), "-c", sql], check=True, capture_output=True, text=True)
        return out.stdout

    def stop(self, remove: bool = True) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
            except subprocess.CalledProcessError:
                pass
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
