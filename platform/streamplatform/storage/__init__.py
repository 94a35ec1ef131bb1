"""Where the runtime's tables and files live: one filesystem layer for everything under
``platform.delta.root``, a local path or a URI on object storage (``s3://``/``s3a://``; other
schemes delta-rs and pyarrow know, such as ``gs://`` or ``abfss://``, through their own
environment variables).

Three engines touch the root, and each is given the same place and credentials here, from the
``platform.storage.s3.*`` settings, else the standard AWS environment variables:
- **delta-rs** (the driver's offset and commit logs, the claim, changelog appends, direct sink
  appends, maintenance): :func:`delta_options` gives its ``storage_options``. Its commits on S3
  are conditional puts (``If-None-Match: *``), so two writers of one table version cannot both
  succeed, which is what the one-driver claim (runtime/claim.py) relies on;
- **pyarrow** (executors reading changelog and snapshot files, tasks writing their side and
  spill files, the driver reading them back): :func:`filesystem` gives a ``pyarrow.fs``
  filesystem and the path in it;
- **Spark** (Hadoop's S3A, for the Delta sinks Spark writes and for reading any table):
  :func:`spark_settings` gives the ``spark.hadoop.fs.s3a.*`` settings, ``s3://`` included.

The settings of a root are registered per bucket in each process that touches it
(:func:`configure`; the driver does it when a job starts, an executor when it runs a task), so
the many places that read or write a path need only the path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa

S3_SCHEMES = ("s3", "s3a")
# Schemes delta-rs and pyarrow read and write with their own configuration (environment).
OTHER_OBJECT_SCHEMES = ("gs", "gcs", "abfs", "abfss", "az", "adl", "azure")
S3_SETTINGS = (
    "platform.storage.s3.endpoint",
    "platform.storage.s3.region",
    "platform.storage.s3.access.key.id",
    "platform.storage.s3.secret.access.key",
    "platform.storage.s3.session.token",
    "platform.storage.s3.path.style.access",
)
# Where a setting falls back to when it is not given (the AWS CLI's and SDKs' names).
_ENVIRONMENT = {
    "platform.storage.s3.endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "platform.storage.s3.region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "platform.storage.s3.access.key.id": ("AWS_ACCESS_KEY_ID",),
    "platform.storage.s3.secret.access.key": ("AWS_SECRET_ACCESS_KEY",),
    "platform.storage.s3.session.token": ("AWS_SESSION_TOKEN",),
}
DEFAULT_REGION = "us-east-1"


def scheme(uri: str) -> str:
    """The URI's scheme ("" for a local path, also ``file:``)."""
    found = urlparse(uri).scheme.lower()
    return "" if found == "file" or len(found) <= 1 else found  # "C:" is a drive, not a scheme


def is_local(uri: str) -> bool:
    return scheme(uri) == ""


def local_path(uri: str) -> str:
    """A local path or ``file:`` URI as a path."""
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def check_root(root: str) -> None:
    """Raise ValueError for a ``platform.delta.root`` that the engines cannot use (the
    settings' check names the setting)."""
    found = scheme(root)
    if found and found not in S3_SCHEMES + OTHER_OBJECT_SCHEMES:
        raise ValueError(
            f"the scheme {found}:// is not supported (a local "
            f"path, file://, s3:// or s3a://, or one of {', '.join(OTHER_OBJECT_SCHEMES)})"
        )
    if found in S3_SCHEMES and not urlparse(root).netloc:
        raise ValueError(f"no bucket after {found}://")


@dataclass(frozen=True)
class S3Settings:
    """Where an S3 root's bucket is and how to sign requests to it."""

    endpoint: str | None = None  # None: AWS's own endpoint for the region
    region: str = DEFAULT_REGION
    access_key_id: str | None = None  # None: the SDKs' default credential chain
    secret_access_key: str | None = None
    session_token: str | None = None
    path_style: bool = False

    def __repr__(self) -> str:  # never show credentials
        return f"S3Settings(endpoint={self.endpoint!r}, region={self.region!r})"

    @property
    def _http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def delta_options(self) -> dict[str, str]:
        """delta-rs' ``storage_options``."""
        options = {"AWS_REGION": self.region}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(self._http).lower()
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not self.path_style).lower()
        for key, value in (
            ("AWS_ACCESS_KEY_ID", self.access_key_id),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key),
            ("AWS_SESSION_TOKEN", self.session_token),
        ):
            if value:
                options[key] = value
        return options

    def arrow_filesystem(self) -> Any:
        import pyarrow.fs as pafs

        options: dict[str, Any] = {
            "region": self.region,
            "force_virtual_addressing": not self.path_style,
        }
        if self.endpoint:
            parsed = urlparse(self.endpoint)
            options["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
            options["scheme"] = parsed.scheme or "https"
        if self.access_key_id:
            options |= {"access_key": self.access_key_id, "secret_key": self.secret_access_key,
                        "session_token": self.session_token}  # fmt: skip
        return pafs.S3FileSystem(**options)

    def hadoop_settings(self) -> dict[str, str]:
        """Hadoop's S3A settings (without Spark's ``spark.hadoop.`` prefix)."""
        settings = {
            # s3:// in Spark means S3A too, so one URI serves both engines.
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.endpoint.region": self.region,
            "fs.s3a.path.style.access": str(self.path_style).lower(),
        }
        if self.endpoint:
            settings["fs.s3a.endpoint"] = self.endpoint
            settings["fs.s3a.connection.ssl.enabled"] = str(not self._http).lower()
        if self.access_key_id:
            settings |= {"fs.s3a.access.key": self.access_key_id,
                         "fs.s3a.secret.key": self.secret_access_key or ""}  # fmt: skip
            if self.session_token:
                settings["fs.s3a.session.token"] = self.session_token
                settings["fs.s3a.aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
                )
            else:
                settings["fs.s3a.aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
                )
        return settings


def resolved_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``platform.storage.s3.*`` settings, each given one or else from the environment:
    what a driver ships to its executors, which need not have that environment."""
    resolved: dict[str, Any] = {}
    for name in S3_SETTINGS:
        value = settings.get(name)
        for variable in _ENVIRONMENT.get(name, ()):
            if value is None and os.environ.get(variable):
                value = os.environ[variable]
        if value is not None:
            resolved[name] = value
    return resolved


def s3_settings(settings: Mapping[str, Any]) -> S3Settings:
    resolved = resolved_settings(settings)
    endpoint = resolved.get("platform.storage.s3.endpoint")
    path_style = resolved.get("platform.storage.s3.path.style.access")
    return S3Settings(
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=resolved.get("platform.storage.s3.region") or DEFAULT_REGION,
        access_key_id=resolved.get("platform.storage.s3.access.key.id"),
        secret_access_key=resolved.get("platform.storage.s3.secret.access.key"),
        session_token=resolved.get("platform.storage.s3.session.token"),
        # An endpoint of one's own is an S3-compatible server: most want path-style requests.
        path_style=bool(endpoint) if path_style is None else _truth(path_style),
    )


def _truth(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() == "true"


# --- per-process registration, by bucket -----------------------------------------------------

_BUCKETS: dict[str, S3Settings] = {}
_LOCK = threading.Lock()


def _bucket(uri: str) -> str:
    return urlparse(uri).netloc


def configure(settings: Mapping[str, Any]) -> None:
    """Register the storage settings of ``settings``' ``platform.delta.root`` in this process
    (idempotent; a local root needs none)."""
    root = settings.get("platform.delta.root") or ""
    if scheme(root) in S3_SCHEMES:
        found = s3_settings(settings)
        with _LOCK:
            _BUCKETS[_bucket(root)] = found


def settings_for(uri: str) -> S3Settings:
    """The settings registered for the bucket of ``uri``; else from the environment."""
    with _LOCK:
        found = _BUCKETS.get(_bucket(uri))
    return found if found is not None else s3_settings({})


def delta_options(uri: str) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for a table at ``uri`` (None: a local path, or a scheme
    delta-rs configures from its environment)."""
    return settings_for(uri).delta_options() if scheme(uri) in S3_SCHEMES else None


@functools.lru_cache(maxsize=16)
def _s3_filesystem(settings: S3Settings) -> Any:
    return settings.arrow_filesystem()


def filesystem(uri: str) -> tuple[Any, str]:
    """The ``pyarrow.fs`` filesystem of ``uri`` and the path in it."""
    import pyarrow.fs as pafs

    found = scheme(uri)
    if not found:
        return pafs.LocalFileSystem(), os.path.abspath(local_path(uri))
    if found in S3_SCHEMES:
        parsed = urlparse(uri)
        return _s3_filesystem(settings_for(uri)), f"{parsed.netloc}{parsed.path}".rstrip("/")
    return pafs.FileSystem.from_uri(uri)


def spark_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    """The Spark settings (``spark.hadoop.fs.s3a.*``) for ``settings``' root; {} for a root
    that is not on S3."""
    if scheme(settings.get("platform.delta.root") or "") not in S3_SCHEMES:
        return {}
    return {f"spark.hadoop.{k}": v for k, v in s3_settings(settings).hadoop_settings().items()}


def configure_spark(spark: Any, settings: Mapping[str, Any]) -> None:
    """Register ``settings``' root in this process (:func:`configure`) and apply its S3A
    settings to a running session: its Hadoop configuration (the driver's filesystems) and its
    SQL settings, which every query's Hadoop configuration, on the executors too, is made from.
    Hadoop keeps one S3A filesystem per bucket per JVM, made with the settings of its first
    use."""
    configure(settings)
    found = spark_settings(settings)
    if not found:
        return
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in found.items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)
        spark.conf.set(key.removeprefix("spark.hadoop."), value)


# --- files under the root ----------------------------------------------------------------


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def exists(uri: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def list_files(directory: str, suffix: str) -> list[str]:
    """The files directly in ``directory`` whose names end in ``suffix``, sorted, as URIs (or
    paths) in the form ``directory`` was given; [] when there is no such directory."""
    import pyarrow.fs as pafs

    fs, path = filesystem(directory)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = sorted(i.base_name for i in infos
                   if i.type == pafs.FileType.File and i.base_name.endswith(suffix))  # fmt: skip
    return [join(directory, name) for name in names]


def list_directories(directory: str) -> list[str]:
    """The directories directly in ``directory``, as names."""
    import pyarrow.fs as pafs

    fs, path = filesystem(directory)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def remove_tree(directory: str) -> None:
    """Remove ``directory`` and everything in it; nothing happens when it is not there."""
    fs, path = filesystem(directory)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass
    except OSError:
        if exists(directory):
            raise


def write_json(uri: str, content: Any) -> None:
    """``content`` as a JSON file at ``uri``, whole or not at all (write_file)."""
    data = json.dumps(content).encode()
    write_file(uri, lambda stream: stream.write(data))


def read_json(uri: str) -> Any:
    """The JSON file at ``uri``; None when there is none."""
    if not exists(uri):
        return None
    with open_input(uri) as stream:
        return json.loads(stream.read())


def remove_file(uri: str) -> None:
    """Remove the file ``uri``; nothing happens when it is not there."""
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def write_file(uri: str, write: Callable[[Any], None]) -> None:
    """Write a file whole or not at all: ``write(stream)`` fills it. On a local disk it is
    written under a temporary name of its own (a speculative copy of a task may write beside
    it) and renamed; an object store's put makes an object appear only once it is complete."""
    fs, path = filesystem(uri)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    if scheme(uri):
        with fs.open_output_stream(path) as stream:
            write(stream)
        return
    partial = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with fs.open_output_stream(partial) as stream:
            write(stream)
        fs.move(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


@contextlib.contextmanager
def local_copy(directory: str) -> Iterator[str]:
    """``directory`` as a local directory to read: itself when it is local; else its files
    downloaded once (in parallel) into a temporary directory, removed afterwards. A reader
    that goes over the files twice (the driver's check of the tasks' reports, then the sink
    append) then fetches each object once."""
    if is_local(directory):
        yield directory
        return
    import pyarrow.fs as pafs

    with tempfile.TemporaryDirectory(prefix="streamplatform-side-") as local:
        fs, path = filesystem(directory)
        if list_files(directory, ""):
            pafs.copy_files(path, local, source_filesystem=fs,
                            destination_filesystem=pafs.LocalFileSystem())  # fmt: skip
        yield local


def open_input(uri: str) -> Any:
    """A random-access file to read (parquet and Arrow IPC readers take it)."""
    fs, path = filesystem(uri)
    return fs.open_input_file(path)


def read_parquet(uri: str, **options: Any) -> pa.Table:
    import pyarrow.parquet as pq

    fs, path = filesystem(uri)
    return pq.read_table(path, filesystem=fs, **options)


def parquet_batches(uri: str, batch_size: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    with open_input(uri) as source, pq.ParquetFile(source) as parquet:
        yield from parquet.iter_batches(batch_size=batch_size, columns=columns)
