"""The one filesystem layer under recordings that live at a URL (``s3://``, ``gs://``, ``az://``, ``hdfs://``, ...).

Every place that takes a recording path (the recorder's root, ``GroupReader``, ``comgra --path``, ``comgra
scan``, ``comgra repair``, ``comgra sync``, ``comgra.serve``) asks ``is_url`` first; a URL becomes a ``Location``:
a ``pyarrow.fs.FileSystem`` and the path inside it. pyarrow's own filesystems serve ``s3://`` (S3FileSystem),
``gs://`` (GcsFileSystem), ``hdfs://`` (HadoopFileSystem) and ``file://``; every other scheme fsspec knows
(``az://`` and ``abfs://`` through adlfs, ``memory://``, ...) is wrapped as ``PyFileSystem(FSSpecHandler(...))``,
so the uploader and the mirror (``store.uploader``, ``store.remote``) see one API.

Credentials and endpoints come from each store's standard environment and files (for S3 the AWS SDK's chain:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/...``; ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` and ``AWS_DEFAULT_REGION`` are read here, since pyarrow does not read them), or from
``[storage.options.<scheme>]`` in comgra.toml. They are handed to the filesystem only, never written into a
recording. Nothing here opens a connection: creating a Location is cheap, and a bad URL or a missing package fails
at once with a ConfigError naming the package to install.

    >>> is_url("s3://bucket/runs"), is_url("/tmp/runs"), is_url("file:///tmp/runs")
    (True, False, False)
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs

from comgra.errors import ConfigError

__all__ = ["Location", "is_url", "local_path", "open_location", "url_digest"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_ONE_SLASH = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/(?!/)")  # s3:/bucket: what Path() makes of s3://bucket
# The extra that installs what a scheme needs, where pyarrow alone may not serve it.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
          "adl": "azure"}
_PYARROW = {"s3": "S3FileSystem", "s3a": "S3FileSystem", "gs": "GcsFileSystem", "gcs": "GcsFileSystem",
            "hdfs": "HadoopFileSystem"}
SUPPORTED = "s3://, gs://, az://, abfs://, hdfs://, file:// and local paths (or any scheme fsspec knows)"


def is_url(path: Any) -> bool:
    """True for a remote URL (``scheme://...``); False for a local path and for ``file://`` URLs."""
    if not isinstance(path, str):
        return False
    match = _SCHEME.match(path)
    return match is not None and match.group(1).lower() not in ("file", "local")


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local path or ``file://`` URL as a Path (``file:///tmp/x`` -> ``/tmp/x``); a remote URL is refused."""
    if isinstance(path, str):
        match = _SCHEME.match(path)
        if match and match.group(1).lower() in ("file", "local"):
            parts = urlsplit(path)
            if parts.netloc not in ("", "localhost"):
                raise ConfigError(f"{path!r} names the host {parts.netloc!r}; a file:// URL must be local "
                                  "(file:///absolute/path).")
            return Path(unquote(parts.path))
        if match:
            raise ConfigError(f"{path!r} is a URL, not a local folder; pass it where comgra takes a URL.")
        if _ONE_SLASH.match(path):
            raise ConfigError(f"{path!r} looks like a URL with one '/' after the scheme; write "
                              f"{path.split(':', 1)[0]}://{path.split(':', 1)[1].lstrip('/')} (or ./{path} for a local "
                              "folder of that name).")
    return Path(path).expanduser()


def url_digest(*parts: str) -> str:
    """A short, stable folder name for a URL (the spool and the mirror are keyed by it)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Location:
    """A folder in some filesystem: ``url`` as the user gave it (no trailing '/'), ``path`` inside ``filesystem``."""

    url: str
    scheme: str
    filesystem: pafs.FileSystem
    path: str

    def child(self, relative: str) -> Location:
        relative = relative.strip("/")
        return Location(f"{self.url}/{relative}", self.scheme, self.filesystem, f"{self.path}/{relative}")

    def key(self, relative: str) -> str:
        """The filesystem path of ``relative`` (a POSIX path below this folder)."""
        return f"{self.path}/{relative}"

    def list_files(self) -> dict[str, tuple[int, int]]:
        """Every file below this folder: relative path -> (size, mtime in ns; 0 where the store has none).
        One recursive listing (S3: LIST pages of 1,000 keys); an absent folder has no files."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        found: dict[str, tuple[int, int]] = {}
        for info in self.filesystem.get_file_info(selector):
            if info.type == pafs.FileType.File:
                relative = info.path[len(self.path):].lstrip("/")
                found[relative] = (int(info.size or 0), int(info.mtime_ns or 0))
        return found

    def upload(self, source: Path, relative: str) -> None:
        """Copy a local file to ``relative``: one object, complete or absent (S3: a PUT or a completed multipart)."""
        parent = self.key(relative).rsplit("/", 1)[0]
        if self.scheme not in _FLAT:
            self.filesystem.create_dir(parent, recursive=True)
        # Read and sent in blocks through Arrow's streams, which release the GIL while they read and send. Not
        # ``pyarrow.fs.copy_files``: it drops the error of the final close, where S3 sends the object (a PUT to a
        # store that does not answer "succeeded", and the journal recorded a file as uploaded that never was).
        # Blocks of the file's own size (up to 8 MiB): a chunk of 30 KB does not allocate and free 8 MiB twice.
        remaining = os.stat(source).st_size
        with _LOCAL.open_input_stream(str(source)) as stream, \
                self.filesystem.open_output_stream(self.key(relative)) as out:
            while True:
                block = stream.read_buffer(max(1, min(UPLOAD_BLOCK, remaining)))  # an Arrow buffer: no bytes copy
                if not block.size:
                    break
                out.write(block)
                remaining -= block.size

    def download(self, relative: str) -> bytes:
        with self.filesystem.open_input_stream(self.key(relative)) as stream:
            return bytes(stream.read())

    def delete(self, relative: str) -> None:
        try:
            self.filesystem.delete_file(self.key(relative))
        except FileNotFoundError:
            pass


# Stores without folders: nothing to create before a PUT.
_FLAT = frozenset({"s3", "s3a", "gs", "gcs"})
_LOCAL = pafs.LocalFileSystem()
UPLOAD_BLOCK = 8 << 20


def open_location(url: str, storage_options: dict[str, Any] | None = None, *, config: Any = None) -> Location:
    """The Location of ``url``; ConfigError for an unknown scheme, a bad URL or a package that is missing.

    ``storage_options`` (keyword arguments of the filesystem) win over ``[storage.options.<scheme>]`` of
    ``config`` (a comgra.config.Settings; without it, comgra.toml in the working directory if there is one)."""
    match = _SCHEME.match(url) if isinstance(url, str) else None
    if match is None:
        raise ConfigError(f"{url!r} is not a URL; pass e.g. 's3://bucket/runs' or a local folder.")
    scheme = match.group(1).lower()
    parts = urlsplit(url)
    if scheme in ("file", "local"):
        folder = local_path(url).resolve()
        return Location(str(folder), "file", pafs.LocalFileSystem(), str(folder))
    if not parts.netloc:
        raise ConfigError(f"{url!r} names no bucket or host; write it as {scheme}://BUCKET/folder.")
    if storage_options is None:
        storage_options = _configured_options(scheme, config)
    filesystem = _filesystem(scheme, url, parts.netloc, dict(storage_options))
    inside = f"{parts.netloc}{parts.path}".rstrip("/") if scheme != "hdfs" else (parts.path.rstrip("/") or "/")
    return Location(url.rstrip("/"), scheme, filesystem, inside)


def _configured_options(scheme: str, config: Any) -> dict[str, Any]:
    if config is None:
        from comgra.config import load_settings
        config = load_settings()
    options = config.storage.options
    return dict(options.get(scheme, {}))


def _filesystem(scheme: str, url: str, host: str, options: dict[str, Any]) -> pafs.FileSystem:
    kind = _PYARROW.get(scheme)
    if kind is not None and hasattr(pafs, kind):
        try:
            if kind == "S3FileSystem":
                return pafs.S3FileSystem(**_s3_options(options))
            if kind == "GcsFileSystem":
                return pafs.GcsFileSystem(**options)
            host_name, _, port = host.partition(":")
            return pafs.HadoopFileSystem(host_name, int(port or 8020), **options)
        except TypeError as error:
            raise ConfigError(f"storage options {sorted(options)} for {url!r}: {error}. See pyarrow.fs.{kind} for "
                              "the keys it takes ([storage.options." + scheme + "] in comgra.toml).") from None
        except (OSError, ImportError) as error:
            need = ("a Hadoop client (HADOOP_HOME, libhdfs.so, CLASSPATH) and Java, which pyarrow's HadoopFileSystem "
                    "loads" if scheme == "hdfs" else f"pip install 'comgra[{EXTRAS[scheme]}]'")
            raise ConfigError(f"comgra cannot open {url!r}: {error}. Install what this store needs: {need}.") from None
    return _fsspec(scheme, url, options)


def _s3_options(options: dict[str, Any]) -> dict[str, Any]:
    """S3FileSystem's keywords, with the endpoint and region of the AWS environment that pyarrow does not read."""
    options = dict(options)
    endpoint = options.pop("endpoint_url", None) or options.get("endpoint_override") \
        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        options["endpoint_override"] = split.netloc + split.path.rstrip("/")
        options.setdefault("scheme", split.scheme)
    # One PutObject for a small file, not a three-request multipart upload; bounded waits on a stalled connection.
    options.setdefault("allow_delayed_open", True)
    # The PUT on the uploading thread (a lowered priority, see store.uploader), not on Arrow's shared IO pool.
    options.setdefault("background_writes", False)
    options.setdefault("connect_timeout", 10.0)
    options.setdefault("request_timeout", 60.0)
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    if region:
        options.setdefault("region", region)
    return options


def _fsspec(scheme: str, url: str, options: dict[str, Any]) -> pafs.FileSystem:
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:
        raise ConfigError(f"{url!r} needs fsspec for the scheme {scheme!r}: pip install "
                          f"'comgra[{EXTRAS.get(scheme, 'fsspec')}]'.") from None
    if scheme not in known_implementations and scheme not in fsspec.available_protocols():
        raise ConfigError(f"{url!r}: comgra knows no filesystem for the scheme {scheme!r}. It reads {SUPPORTED}.")
    try:
        kind = fsspec.get_filesystem_class(scheme)
    except ImportError as error:
        extra = EXTRAS.get(scheme)
        install = f"pip install 'comgra[{extra}]'" if extra else "install the package it names"
        raise ConfigError(f"{url!r} needs a package that is not installed ({error}); {install}.") from None
    try:
        return pafs.PyFileSystem(pafs.FSSpecHandler(kind(**options)))
    except TypeError as error:
        raise ConfigError(f"storage options {sorted(options)} for {url!r}: {error}.") from None
