"""``comgra sync LOCAL URL``: upload a local recording folder (a spool a crashed run left, or any recording) to a URL.

LOCAL is a group folder (``comgra_root_path/group``) and URL the group's URL (``s3://bucket/runs/group``); each
file goes under the same relative key, the steps chunks after their data, and files merged away since an
earlier upload are deleted remotely after what replaced them is up (the journal in the parent folder's
``.comgra-upload/``: see comgra.store.uploader). Safe to run again, and beside a run that still records into
LOCAL: a file already uploaded is not sent twice. Prints one line; exit 0 when everything is up, 1 when files
are left (run it again), 2 on a bad argument.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from comgra.cli.arguments import UsageError, recording_path


def sync_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comgra sync", description="Upload a local recording folder to a URL "
                                     "(s3://, gs://, az://, hdfs://, ...), e.g. the spool of a run that crashed.")
    parser.add_argument("local", type=recording_path, help="the local group folder (comgra_root_path/group)")
    parser.add_argument("url", help="the group's URL, e.g. s3://bucket/runs/group")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)")
    return parser


def run(arguments: Sequence[str]) -> int:
    from comgra.errors import ComgraError
    from comgra.store.filesystems import is_url, open_location
    from comgra.store.uploader import Uploader

    args = sync_parser().parse_args(list(arguments))
    if is_url(args.local):
        raise UsageError(f"LOCAL {args.local!r} must be a local folder; the URL comes second.")
    local = args.local.resolve()
    if not (local / "trials").is_dir():
        raise UsageError(f"{str(local)!r} holds no comgra recording (no 'trials' folder); pass a group folder.")
    if not is_url(args.url):
        raise UsageError(f"URL {args.url!r} is not a URL; pass e.g. s3://bucket/runs/{local.name}.")
    try:
        uploader = Uploader(local, open_location(args.url), journal_root=local.parent)
    except ComgraError as error:
        raise UsageError(str(error)) from None
    result = uploader.finish(args.timeout)
    total = uploader.total
    print(f"comgra sync: {total.uploaded} file(s) ({total.bytes / 2**20:.1f} MiB) uploaded, {total.deleted} deleted "
          f"remotely, {result.pending} left" + (f" (last error: {result.errors[-1]})" if result.errors else ""))
    return 0 if not result.pending and not result.errors else 1
