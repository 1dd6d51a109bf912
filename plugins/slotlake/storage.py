"""The lake's plain files (everything that is not a Delta table written by Spark) on a local disk or on S3.

Bronze files, coverage markers, the bootstrap catalog, the initial copies' parts and records, and the Delta logs
read without a JVM all go through one small API, `Files` (`files_for(path)`): `LocalFiles` for a local lake,
`S3Files` (boto3) for `lake: s3a://bucket/prefix`. Both keep the two promises bronze needs:

- `put_new` never replaces an object: locally a hidden temporary file is fsynced and hard-linked into place (a link
  fails when the name is taken), then unlinked; on S3 it is ONE conditional PUT (`If-None-Match: *`), which the
  store refuses with 412 when the name exists, so a second writer of the same name fails instead of replacing
  what the first archived.
- when `put_new` / `write_replace` return, the data is durable (fsync + folder fsync; a PUT that returned 200).

Also here, so each is defined once: the Spark `fs.s3a.*` settings, and the URI and `storage_options` delta-rs
needs for the same lake. Credentials come only from the environment (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, optional `AWS_SESSION_TOKEN`): never from the config file, never on a command line or in
a log. Spark reads them through `EnvironmentVariableCredentialsProvider`, delta-rs and boto3 from the same
variables.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slotlake.errors import ConfigError, SlotlakeError

S3A = "s3a://"
ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"
# Hadoop's S3A names the AWS SDK v2 class; it reads exactly the two variables above (and the session token).
ENV_CREDENTIALS_PROVIDER = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"


@dataclass(frozen=True)
class StorageSettings:
    """The config's `storage:` section (only for an s3a lake). `endpoint` None: AWS S3 itself."""

    endpoint: str | None = None  # http(s)://host:port of an S3-compatible store (MinIO, Ceph, moto)
    region: str | None = None  # None: the SDKs' default (AWS_REGION / us-east-1)
    path_style: bool = False  # bucket in the path (http://host/bucket/key), as most S3-compatible stores need


def is_s3(path: str) -> bool:
    return path.startswith(S3A)


def split_s3(path: str) -> tuple[str, str]:
    """`s3a://bucket/some/key` -> ("bucket", "some/key")."""
    if not is_s3(path):
        raise ValueError(f"not an s3a:// path: {path}")
    bucket, _, key = path[len(S3A):].partition("/")
    return bucket, key.strip("/")


def local_path(path: str) -> Path:
    """A local lake path (`/x`, `file:///x`) as a Path; other schemes are an error saying which are supported."""
    if path.startswith("file://"):
        return Path(path[len("file://"):])
    if "://" in path:
        raise SlotlakeError(f"{path}: the lake must be a local path or s3a://bucket/prefix")
    return Path(path)


def supported(path: str) -> bool:
    """True for the lakes `files_for` can read and write: local paths and s3a://."""
    return is_s3(path) or path.startswith("file://") or "://" not in path


# ---- the settings for the engines that read the lake themselves ---------------------------------------------

def delta_rs_uri(path: str) -> str:
    """A lake path as delta-rs names it: `s3a://` is Hadoop's scheme for what delta-rs calls `s3://`."""
    return "s3://" + path[len(S3A):] if is_s3(path) else path


def delta_rs_options(settings: StorageSettings | None) -> dict[str, str]:
    """delta-rs `storage_options` for the lake (empty for a local lake). No credentials: delta-rs reads
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment like boto3 and Spark.

    A delta-rs *writer* on S3 needs a safe commit: `aws_conditional_put: etag` makes it create each log entry with
    a conditional PUT (S3 since 2024, MinIO, R2), instead of `AWS_S3_ALLOW_UNSAFE_RENAME`, which is safe only
    with one writer. slotlake's own Delta writes go through Spark; this is for readers and users' tools."""
    if settings is None:
        return {}
    opts = {"aws_conditional_put": "etag"}
    if settings.region:
        opts["AWS_REGION"] = settings.region
    if settings.endpoint:
        opts["AWS_ENDPOINT_URL"] = settings.endpoint
        if settings.endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if settings.path_style:
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    return opts


def delta_rs_table_args(path: str) -> tuple[str, dict[str, str]]:
    """(table URI, storage_options) to open the lake table at `path` with `deltalake.DeltaTable(uri,
    storage_options=...)`: an s3a path with this process's settings (`configure`), a local path as it is."""
    if is_s3(path):
        return delta_rs_uri(path), delta_rs_options(active_settings())
    return str(local_path(path)), {}


def arrow_files(path: str) -> tuple[Any, str]:
    """(pyarrow file system, path on it) to read the lake file or folder at `path` with pyarrow (`pq.read_table`,
    `ds.dataset`, ... with `filesystem=`): None and the local path for a local lake, an `S3FileSystem` with this
    process's settings and `bucket/key` for s3a (credentials from the environment, as boto3 and delta-rs)."""
    if not is_s3(path):
        return None, str(local_path(path))
    return _arrow_s3(active_settings(), *(credentials().get(k) for k in
                                          ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"))), \
        path[len(S3A):]


@functools.cache
def _arrow_s3(settings: StorageSettings, key: str, secret: str, token: str | None) -> Any:
    from pyarrow import fs

    endpoint = settings.endpoint or ""
    scheme = "http" if endpoint.startswith("http://") else "https"
    return fs.S3FileSystem(access_key=key, secret_key=secret, session_token=token,
                           region=settings.region or "us-east-1",
                           endpoint_override=endpoint.split("://", 1)[-1] or None, scheme=scheme,
                           force_virtual_addressing=bool(endpoint) and not settings.path_style)


def spark_s3a_conf(settings: StorageSettings) -> dict[str, str]:
    """The `spark.hadoop.fs.s3a.*` settings of an s3a lake. No secret values: the credentials provider reads the
    environment of the driver (and of executors, which a cluster gives them or an instance role replaces)."""
    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.aws.credentials.provider": ENV_CREDENTIALS_PROVIDER,
        "spark.hadoop.fs.s3a.path.style.access": "true" if settings.path_style else "false",
    }
    if settings.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false" if settings.endpoint.startswith("http://") \
            else "true"
    if settings.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = settings.region
    return conf


# ---- the settings this process uses for s3a paths -------------------------------------------------------------

_active: StorageSettings | None = None


def configure(settings: StorageSettings) -> None:
    """Use `settings` for every s3a path this process touches (set by `config.parse_config` for an s3a lake).

    A process serves one config, and the functions reading lake files take paths (from `LakePaths`), so the
    endpoint travels here once instead of through every call; `recover --to s3a://other-bucket` uses the same
    endpoint and credentials."""
    global _active
    _active = settings


def active_settings() -> StorageSettings:
    """The configured settings, else AWS S3 with the SDKs' defaults."""
    return _active or StorageSettings()


# ---- the file API ----------------------------------------------------------------------------------------------

class Files(Protocol):
    """The lake's plain files. Paths are full lake paths (`/lake/src/bronze/x`, `s3a://b/p/src/bronze/x`)."""

    def list_names(self, folder: str) -> list[str]:
        """Names directly under `folder` (files and subfolders), sorted; [] when there is no such folder."""
        ...

    def exists(self, path: str) -> bool:
        ...

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError when it does not exist."""
        ...

    def size(self, path: str) -> int:
        """The file's size in bytes; FileNotFoundError when it does not exist."""
        ...

    def get_file(self, path: str, local: str) -> None:
        """Copy the file at `path` to the local path `local` (streamed, not held in memory); FileNotFoundError
        when it does not exist."""
        ...

    def put_new(self, path: str, data: bytes) -> None:
        """Create `path` durably; FileExistsError (nothing changed) when it exists."""
        ...

    def put_new_file(self, path: str, local: str) -> int:
        """Place the complete local file `local` at `path` like `put_new` (the local file is consumed); returns its
        size in bytes."""
        ...

    def write_replace(self, path: str, data: bytes) -> None:
        """Create or replace `path` atomically and durably (readers see the old or the new bytes, never a mix)."""
        ...

    def replace_file(self, path: str, local: str) -> int:
        """Place the complete local file `local` at `path` like `write_replace` (the local file is consumed);
        returns its size in bytes."""
        ...

    def remove(self, path: str) -> None:
        """Delete `path` (nothing when it does not exist)."""
        ...

    def remove_tree(self, folder: str) -> None:
        """Delete `folder` and everything under it (nothing when it does not exist)."""
        ...


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalFiles:
    """A lake on the local filesystem (or a mount): hidden `.tmp` files, fsync, rename, folder fsync."""

    def list_names(self, folder: str) -> list[str]:
        p = local_path(folder)
        return sorted(e.name for e in os.scandir(p)) if p.is_dir() else []

    def exists(self, path: str) -> bool:
        return local_path(path).exists()

    def read_bytes(self, path: str) -> bytes:
        return local_path(path).read_bytes()

    def size(self, path: str) -> int:
        return local_path(path).stat().st_size

    def get_file(self, path: str, local: str) -> None:
        shutil.copyfile(local_path(path), local)

    def _tmp(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.parent / f".{final.name}.tmp"

    def put_new(self, path: str, data: bytes) -> None:
        final = local_path(path)
        tmp = self._tmp(final)
        tmp.write_bytes(data)
        try:
            self.put_new_file(path, str(tmp))
        finally:
            tmp.unlink(missing_ok=True)

    def put_new_file(self, path: str, local: str) -> int:
        final, src = local_path(path), Path(local)
        final.parent.mkdir(parents=True, exist_ok=True)
        _fsync_file(src)
        size = src.stat().st_size
        os.link(src, final)  # atomic and never replaces: FileExistsError when the name is taken
        os.unlink(src)
        _fsync_dir(final.parent)
        return size

    def write_replace(self, path: str, data: bytes) -> None:
        final = local_path(path)
        tmp = self._tmp(final)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def replace_file(self, path: str, local: str) -> int:
        final, src = local_path(path), Path(local)
        final.parent.mkdir(parents=True, exist_ok=True)
        _fsync_file(src)
        size = src.stat().st_size
        os.replace(src, final)
        _fsync_dir(final.parent)
        return size

    def remove(self, path: str) -> None:
        local_path(path).unlink(missing_ok=True)

    def remove_tree(self, folder: str) -> None:
        shutil.rmtree(local_path(folder), ignore_errors=True)


def credentials() -> dict[str, str]:
    """boto3's credential arguments from the environment; ConfigError naming the variables when they are unset."""
    key, secret = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
    if not key or not secret:
        raise ConfigError(f"an s3a lake needs credentials: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV} in the "
                          "environment (they are never read from the config)")
    out = {"aws_access_key_id": key, "aws_secret_access_key": secret}
    if os.environ.get(SESSION_TOKEN_ENV):
        out["aws_session_token"] = os.environ[SESSION_TOKEN_ENV]
    return out


@functools.cache
def _client(settings: StorageSettings, key: str, secret: str, token: str | None) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    return boto3.client(
        "s3", endpoint_url=settings.endpoint, region_name=settings.region or "us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token,
        config=BotoConfig(s3={"addressing_style": "path" if settings.path_style else "auto"},
                          retries={"mode": "standard", "max_attempts": 5}))


def _error_code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def _not_found_as(path: str) -> Iterator[None]:
    """An S3 call's "no such key" as FileNotFoundError(path), as the local file system says it."""
    try:
        yield
    except Exception as e:
        if _error_code(e) in ("404", "NoSuchKey", "NotFound"):
            raise FileNotFoundError(path) from None
        raise


class S3Files:
    """A lake on S3 or an S3-compatible store, through boto3. "Folders" are key prefixes ending in `/`."""

    def __init__(self, settings: StorageSettings) -> None:
        self.settings = settings

    @property
    def _s3(self) -> Any:
        c = credentials()
        return _client(self.settings, c["aws_access_key_id"], c["aws_secret_access_key"], c.get("aws_session_token"))

    def list_names(self, folder: str) -> list[str]:
        bucket, key = split_s3(folder)
        prefix = f"{key}/" if key else ""
        names: set[str] = set()
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ()))
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", ()))
        names.discard("")
        return sorted(names)

    def exists(self, path: str) -> bool:
        bucket, key = split_s3(path)
        try:
            self._s3.head_object(Bucket=bucket, Key=key)
        except Exception as e:
            if _error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def read_bytes(self, path: str) -> bytes:
        bucket, key = split_s3(path)
        with _not_found_as(path):
            return bytes(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def size(self, path: str) -> int:
        bucket, key = split_s3(path)
        with _not_found_as(path):
            return int(self._s3.head_object(Bucket=bucket, Key=key)["ContentLength"])

    def get_file(self, path: str, local: str) -> None:
        bucket, key = split_s3(path)
        with _not_found_as(path):
            self._s3.download_file(bucket, key, local)

    def _put_new(self, path: str, body: Any) -> None:
        bucket, key = split_s3(path)
        try:
            # One conditional PUT: the store creates the object only if the key is free (412 otherwise), so a
            # placed object is never replaced, and the object is complete and durable once this returns.
            self._s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as e:
            if _error_code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                raise FileExistsError(path) from None
            raise

    def put_new(self, path: str, data: bytes) -> None:
        self._put_new(path, data)

    def put_new_file(self, path: str, local: str) -> int:
        size = os.path.getsize(local)
        try:
            with open(local, "rb") as f:  # one PUT of up to 5 GB: a bronze file is one peek call's output
                self._put_new(path, f)
        finally:
            os.unlink(local)
        return size

    def write_replace(self, path: str, data: bytes) -> None:
        bucket, key = split_s3(path)
        self._s3.put_object(Bucket=bucket, Key=key, Body=data)  # a PUT replaces an object atomically

    def replace_file(self, path: str, local: str) -> int:
        bucket, key = split_s3(path)
        size = os.path.getsize(local)
        try:
            with open(local, "rb") as f:
                self._s3.put_object(Bucket=bucket, Key=key, Body=f)
        finally:
            os.unlink(local)
        return size

    def remove(self, path: str) -> None:
        bucket, key = split_s3(path)
        self._s3.delete_object(Bucket=bucket, Key=key)

    def remove_tree(self, folder: str) -> None:
        bucket, key = split_s3(folder)
        if not key:
            raise ValueError(f"refusing to remove a whole bucket: {folder}")
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/"):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
            if keys:  # at most 1,000 a page, as DeleteObjects takes them
                self._s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


_LOCAL = LocalFiles()


def files_for(path: str) -> Files:
    """The file API for a lake path: S3Files for s3a://, LocalFiles for a local path."""
    if is_s3(path):
        return S3Files(active_settings())
    local_path(path)  # other schemes: one clear error
    return _LOCAL


def join(folder: str, *names: str) -> str:
    """`folder/name/...` for any lake path (string joins keep `s3a://` intact, unlike Path)."""
    return "/".join([folder.rstrip("/"), *names])
