"""A long-lived Spark driver for the slotlake apps: `slotlake spark-server` (its client: `server_client`).

A spark-submit pays a JVM start, the loading of Spark's and Delta's classes and a cold JIT on every run: about
9 s before the first Spark job of a sync, and the first Delta operations of a JVM run several times slower than
the same ones later (bench/README.md "Spark server"). With `spark.server: host:port` in the config, the CLI and
the sync DAG send each app (decode, merge, sync, snapshot, replay) to a server that keeps one SparkSession warm,
and stream its log lines back. Nothing else changes: the same `slotlake.spark_apps.apps` function runs with the same
arguments, the same Delta commits make it exactly-once, and the caller still holds the source's run lock.

Protocol (TCP, one request per connection, JSON lines): the client sends
`{"stage": ..., "argv": [...], "code": <code_digest>}`; the server answers `{"log": line}` lines while the app
runs, then `{"exit": 0, "lines": [...]}` or `{"exit": 1, "error": line}`. The server runs one app at a time
(the rest wait) and refuses a request from other slotlake code (`exit` 2): restart it after an upgrade.

Why not Spark Connect: the apps use the delta-spark Python API (`DeltaTable` merge, history, detail), which over
Spark Connect needs Delta's Connect server plugin, and no build of it for Delta 4.4 / Spark 4.2 is on Maven
Central. The recover app is not served: it carries the destination's password in its environment.
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import sys
import threading
import time
from typing import Any

from slotlake.config import Config
from slotlake.errors import SlotlakeError
from slotlake.spark.code import code_digest
from slotlake.spark.server_client import SERVED_STAGES, parse_address, send_message

log = logging.getLogger(__name__)

class _LineSender(logging.Handler):
    """Sends the log records of a running app to its client; if the client is gone, cancels the app's Spark jobs
    (its Delta commits are atomic: a cancelled app leaves nothing half-done, the next run redoes it)."""

    def __init__(self, sock: socket.socket, spark) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._sock, self._spark, self._lock, self.gone = sock, spark, threading.Lock(), False

    def emit(self, record: logging.LogRecord) -> None:
        if self.gone:
            return
        try:
            line = self.format(record)
            with self._lock:
                send_message(self._sock, {"log": line})
        except OSError:
            self.gone = True
            self._spark.sparkContext.cancelAllJobs()


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address: tuple[str, int], spark, digest: str) -> None:
        super().__init__(address, _Handler)
        self.spark, self.digest, self.run_lock = spark, digest, threading.Lock()
        self.spark_died = False
        self.stopping = False  # set (under run_lock) when it stops: a request accepted meanwhile is declined
        self.last_active = time.monotonic()

    def stop(self) -> None:
        self.stopping = True
        threading.Thread(target=self.shutdown, daemon=True).start()

    def stop_when_idle(self, idle_s: float, on_stop) -> None:
        """Stop serving once no app has run or been asked for in `idle_s` seconds (`spark.server: auto`);
        `on_stop` runs first, while no app can start."""

        def watch() -> None:
            while True:
                time.sleep(min(30.0, max(0.5, idle_s / 4)))
                if not self.run_lock.acquire(blocking=False):
                    continue  # an app is running
                try:
                    if time.monotonic() - self.last_active >= idle_s:
                        log.info("spark server: no app for %.0f s; stopping", idle_s)
                        on_stop()
                        self.stop()
                        return
                finally:
                    self.run_lock.release()

        threading.Thread(target=watch, name="slotlake-idle-watch", daemon=True).start()

    def stop_if_spark_died(self) -> bool:
        """A driver whose JVM is gone would fail every later app: stop serving, so clients use spark-submit and a
        supervisor restarts the server (exit code 1). True if it died."""
        try:
            alive = not self.spark.sparkContext._jsc.sc().isStopped()
        except Exception:  # noqa: BLE001  (py4j cannot reach the JVM: any error means the same)
            alive = False
        if not alive and not self.spark_died:
            self.spark_died = True
            log.error("spark server: the SparkContext is gone; stopping (restart `slotlake spark-server`)")
            threading.Thread(target=self.shutdown, daemon=True).start()
        return not alive


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        try:
            request = json.loads(self.rfile.readline() or b"{}")
        except ValueError:
            send_message(self.request,
                         {"exit": 1, "error": "the request is not JSON: send one line {stage, argv, code}"})
            return
        if request.get("code") != self.server.digest:
            send_message(self.request, {"exit": 2, "error": f"this Spark server runs slotlake code "
                                        f"{self.server.digest}, the client {request.get('code')}: restart "
                                        "`slotlake spark-server`"})
            return
        self.server.last_active = time.monotonic()
        stage, argv = str(request.get("stage")), [str(a) for a in request.get("argv") or []]
        if stage not in SERVED_STAGES:
            send_message(self.request,
                         {"exit": 1, "error": f"stage {stage!r} is not served here: run it with spark-submit"})
            return
        with self.server.run_lock:  # one app at a time: they share the driver's cores and cache
            if self.server.stopping:  # it stopped while this request was on its way: the client uses spark-submit
                send_message(self.request, {"exit": 2, "error": "this Spark server is stopping"})
                return
            if self.server.spark_died or self.server.stop_if_spark_died():
                send_message(self.request, {"exit": 2, "error": "this Spark server's SparkContext is gone: restart "
                                     "`slotlake spark-server`"})
                return
            reply = run_request(self.server.spark, stage, argv, self.request)
            self.server.last_active = time.monotonic()
            if reply["exit"] != 0:
                self.server.stop_if_spark_died()
            send_message(self.request, reply)


def run_request(spark, stage: str, argv: list[str], sock: socket.socket) -> dict[str, Any]:
    """Run one app in `spark`, streaming its log records to `sock`; the final message for the client."""
    from slotlake.config import load_config
    from slotlake.spark_apps.apps import APPS, parse_app_args

    sender = _LineSender(sock, spark)
    root = logging.getLogger()
    root.addHandler(sender)
    started = time.monotonic()
    try:
        try:
            args = parse_app_args(stage, argv)
        except SystemExit:
            return {"exit": 1, "error": f"bad arguments for the {stage} app: {' '.join(argv)}"}
        log.info("spark server: %s %s (config %s)", stage, args.source, args.config)
        try:
            cfg = load_config(args.config)
            cfg.source(args.source)
            lines = APPS[stage].run(spark, cfg, args)
        except SlotlakeError as e:
            return {"exit": 1, "error": f"slotlake {stage} {args.source}: {' '.join(str(e).split())}"}
        except Exception as e:  # a Spark or Delta failure: report it, keep serving (the session survives it)
            log.exception("spark server: %s %s failed", stage, args.source)
            first = (str(e).strip().splitlines() or [""])[0]
            return {"exit": 1, "error": f"slotlake {stage} {args.source}: {type(e).__name__}: {first}"}
        finally:
            spark.catalog.clearCache()
        log.info("spark server: %s %s done in %.1fs", stage, args.source, time.monotonic() - started)
        return {"exit": 0, "lines": lines}
    finally:
        root.removeHandler(sender)


def serve(cfg: Config, address: str, *, ready=None, idle_s: float | None = None, on_stop=None) -> bool:
    """Start the SparkSession of `cfg.spark` and serve apps on `address` until SIGTERM (returns True), until no
    app came for `idle_s` seconds (True), or until its SparkContext dies (False). `ready(address)` runs once it
    listens, `on_stop()` when it stops serving."""
    import signal

    from slotlake.spark.session import get_spark
    # Port 0: any free port (the address bound is what `ready` gets and the log says).
    host, port = (address.rpartition(":")[0], 0) if address.endswith(":0") else parse_address(address)
    digest = code_digest()
    spark = get_spark("slotlake-spark-server", cfg.spark.master, cfg.spark.conf, storage=cfg.storage)
    spark.range(1).count()  # the first Spark job pays the scheduler's start, so the first app does not
    server = _Server((host, port), spark, digest)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    log.info("slotlake spark server listening on %s:%d (master %s, code %s)", host, server.server_address[1],
             cfg.spark.master, digest)
    if ready is not None:
        ready(server.server_address)
    if idle_s is not None:
        server.stop_when_idle(idle_s, on_stop or (lambda: None))
    try:
        server.serve_forever()
    finally:
        server.stopping = True
        if on_stop is not None:
            on_stop()
        server.server_close()
        with server.run_lock:  # an app still running (SIGTERM) finishes first: its commits stay whole
            if not server.spark_died:
                spark.stop()
    return not server.spark_died


def main_serve(cfg: Config, address: str, *, idle_minutes: float | None = None, ready_file: str | None = None) -> int:
    """`slotlake spark-server`. `ready_file`: where to say the pid, address and code once listening (removed when
    it stops; `spark.server: auto` finds the server by it). `idle_minutes`: stop after that long without an app."""
    from slotlake.spark.auto_server import remove_ready_file, write_ready_file

    logging.getLogger("py4j").setLevel(logging.WARNING)
    print(f"starting the slotlake Spark server on {address} (master {cfg.spark.master})", file=sys.stderr,
          flush=True)
    ready = on_stop = None
    if ready_file:
        def ready(bound: tuple[str, int]) -> None:
            write_ready_file(ready_file, bound, code_digest())

        def on_stop() -> None:
            remove_ready_file(ready_file)
    idle_s = idle_minutes * 60 if idle_minutes else None
    return 0 if serve(cfg, address, ready=ready, idle_s=idle_s, on_stop=on_stop) else 1
