"""Which torch.distributed rank this process is, and whether it records.

Every rank of a run writes its own shard of the same trial (chunk names and the ``rank``
column carry the rank), so ranks never coordinate: each one learns its rank number here
and nothing else.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int


def discover_rank(environ: Mapping[str, str] | None = None) -> RankInfo:
    """The process group's rank when one is initialised, else torchrun's ``RANK``/``WORLD_SIZE``, else 0 of 1.

    The environment is the fallback so that a recorder built before ``init_process_group``
    (torchrun sets the variables before the script starts) still knows its rank.
    """
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return RankInfo(distributed.get_rank(), distributed.get_world_size())
    environ = os.environ if environ is None else environ
    rank = _int_or(environ.get("RANK"), 0)
    return RankInfo(rank, max(_int_or(environ.get("WORLD_SIZE"), 1), rank + 1))


def _int_or(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default
