"""A real S3-compatible endpoint for the tests: `moto_server` (moto[server]) on a free local port.

`MotoServer().start()` runs `<venv>/bin/moto_server -H 127.0.0.1 -p <port>`, waits until it answers, and
`new_bucket()` creates an empty bucket per test. Credentials are dummy values set in the test process's
environment only (`TEST_CREDENTIALS`); moto accepts any.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "slotlake-test", "AWS_SECRET_ACCESS_KEY": "slotlake-test-secret"}
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 60.0) -> MotoServer:
        exe = Path(sys.executable).parent / "moto_server"
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"moto-{self.port}.log"
        self._log = open(log_path, "wb")  # noqa: SIM115 (open while the server runs)
        self._proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on {self.endpoint}; see {log_path}") from None
                time.sleep(0.2)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def new_bucket(self) -> str:
        name = f"slotlake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", ())]
        return sorted(out)

    def storage_yaml(self) -> str:
        """The config's `storage:` section for this server."""
        return f"storage:\n  endpoint: {self.endpoint}\n  region: {REGION}\n  path_style: true\n"

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
