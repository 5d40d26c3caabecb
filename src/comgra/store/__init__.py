"""The on-disk store: Parquet chunks plus small JSON documents. No torch here.

``format`` defines the layout and schemas, ``writer`` turns queued rows into
immutable chunk files on a background thread, ``reader`` answers queries with
DuckDB underneath.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from comgra.store.format import FORMAT_VERSION
    from comgra.store.reader import GroupReader, TrialReader

__all__ = ["FORMAT_VERSION", "GroupReader", "TrialReader"]


def __getattr__(name: str) -> Any:
    """The readers on first use: what only writes or uploads (the recorder's writer thread, ``comgra sync``)
    never imports DuckDB and the query layer (a third of ``comgra sync``'s start). ``FORMAT_VERSION`` too: the
    format loads pyarrow, which ``store.arrow_pool`` must run before (``comgra`` chooses Arrow's pool first)."""
    if name == "FORMAT_VERSION":
        from comgra.store.format import FORMAT_VERSION

        return FORMAT_VERSION
    if name in ("GroupReader", "TrialReader"):
        from comgra.store import reader

        return getattr(reader, name)
    raise AttributeError(f"module 'comgra.store' has no attribute {name!r}")
