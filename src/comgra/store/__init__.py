"""The on-disk store: Parquet chunks plus small JSON documents. No torch here.

``format`` defines the layout and schemas, ``writer`` turns queued rows into
immutable chunk files on a background thread, ``reader`` answers queries with
DuckDB underneath.
"""
from comgra.store.format import FORMAT_VERSION
from comgra.store.reader import GroupReader, TrialReader

__all__ = ["FORMAT_VERSION", "GroupReader", "TrialReader"]
