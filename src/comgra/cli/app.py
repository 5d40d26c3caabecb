"""``comgra``: open a recording in the browser; ``comgra demo``: record the tutorial, then open it.

Usage::

    comgra ROOT/GROUP [--port 8055] [--host 127.0.0.1] [--visualization-file F] [--no-findings-scan]
                             [--view '/?tab=...']   # the printed address opens this view
    comgra --use-path-for-test-run          # what comgra-test-run recorded
    comgra demo [P] [--steps 300]           # serve at once, record a short tutorial run into it (needs torch)
    comgra repair PATH                      # remove what a crashed run left (see comgra.store.repair)
    comgra migrate GROUP                    # rewrite a recording of format 1 or 2 as format 3 (docs/format.md)
    comgra compact GROUP                    # one Parquet file per table and rank for each finished trial
    comgra sync LOCAL URL                   # upload a local recording (a crashed run's spool) to s3://... (cli.sync)
    comgra scan ROOT/GROUP [--json]         # findings: anomalies and where they start (see comgra.cli.scan)

Every path may also be given as ``--path PATH``. A bad path or option ends with a one-line message and exit code 2.
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from comgra import terminal
from comgra.cli.arguments import USAGE_ERROR, UsageError, add_path, check_recording, chosen_path, drop_recording_paths, positive_int
from comgra.store.arrow_pool import use_arrow_pool_that_gives_back

__all__ = ["main"]

DEMO_GROUP = "demo"
DEMO_STEPS = 300
COMMANDS = {  # the subcommands: `comgra --help` lists them, `comgra foo` names them
    "demo": "record a short run of the tutorial network (needs torch), then open it",
    "scan": "findings: anomalies and where they start ('comgra scan ROOT/GROUP [--json]')",
    "repair": "remove what a crashed run left in a recording ('comgra repair PATH')",
    "migrate": "rewrite a recording of format 1 or 2 as format 3 ('comgra migrate GROUP')",
    "compact": "one Parquet file per table and rank for each finished trial ('comgra compact GROUP')",
    "sync": "upload a local recording (a crashed run's spool) to a URL ('comgra sync LOCAL URL')",
}


def run() -> None:
    """The ``comgra`` command: ``main()``, then the exit.

    After a server ran, the process leaves with ``os._exit`` once the ``atexit`` handlers are done
    (the service's connections closed, the output flushed): the interpreter's own teardown would meet
    threads of DuckDB and Arrow, and of the app's background scanner, in the middle of native code, and
    glibc aborts such a process ("terminate called ... exception not rethrown") about one time in
    ten after Ctrl+C. Nothing is lost: the app only reads.
    """
    terminal.install()  # this process's log lines and warnings: control characters of recorded text escaped
    code = main()
    if _SERVED:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


_SERVED = False  # set once a server has run and stopped: see run()


def main(argv: Sequence[str] | None = None) -> int:
    drop_recording_paths()  # nothing that came with a recording is imported, wherever this runs from
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        if arguments[:1] == ["demo"]:
            return _demo(_demo_parser().parse_args(arguments[1:]))
        if arguments[:1] == ["repair"]:
            return _repair(arguments[1:])
        if arguments[:1] in (["migrate"], ["compact"]):
            return _migrate(arguments[0], arguments[1:])
        if arguments[:1] == ["sync"]:
            from comgra.cli import sync
            return sync.run(arguments[1:])
        if arguments[:1] == ["scan"]:
            from comgra.cli import scan
            return scan.run(arguments[1:])
        if arguments and not arguments[0].startswith("-") and not _looks_like_a_path(arguments[0]):
            raise UsageError(f"unknown command {arguments[0][:80]!r}; the commands are {', '.join(COMMANDS)} "
                             "(see 'comgra --help'), or open a recording with 'comgra ROOT/GROUP'.")
        return _serve(_parser().parse_args(arguments))
    except UsageError as error:
        print(f"comgra: error: {terminal.printable(error)}", file=sys.stderr)
        return USAGE_ERROR


def _looks_like_a_path(word: str) -> bool:
    """A first word that is no command opens a recording when it names a folder or looks like a path."""
    return "/" in word or os.sep in word or word.startswith(".") or Path(word).expanduser().exists()


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8055, help="port to serve on (default: 8055)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: 127.0.0.1, reachable from this machine only)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests for this host name, e.g. a reverse proxy's (repeatable). "
                             "Bound to loopback, only localhost names are answered; bound to 0.0.0.0, any")
    parser.add_argument("--token-for-reads", action="store_true", default=None,
                        help="every request needs the token printed at start, reads too (for a shared machine; "
                             "comgra.toml: [app] token_for_reads = true). Off loopback this is always so")
    parser.add_argument("--no-token", action="store_true", default=None,
                        help="serve without a token: any local user can then change a paused run (127.0.0.1 only; "
                             "for a single-user machine; comgra.toml: [app] token = false)")


def _parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  comgra {name:<8}{text}" for name, text in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="comgra", description="Inspect a comgra recording in the browser. "
        "'comgra demo --help' records and opens the tutorial.",
        epilog=f"commands ('comgra COMMAND --help' for their options):\n{commands}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"comgra {_version()}")
    add_path(parser, "the group folder: comgra_root_path/group, or its URL (s3://bucket/runs/group, gs://, az://, hdfs://)", required=False)
    parser.add_argument("--use-path-for-test-run", action="store_true",
                        help="open what comgra-test-run recorded in its default location")
    _add_server_options(parser)
    parser.add_argument("--visualization-file", type=Path,
                        help="a Python file with create_visualization(selection, data) for the Visualization tab")
    parser.add_argument("--config", type=Path,
                        help="a comgra.toml file (default: comgra.toml in the working directory, if there is one)")
    parser.add_argument("--view", type=_view_link, default="/", metavar="LINK",
                        help="a view link such as '/?tab=tensors&trial=t&step=40&node=out' (from 'comgra scan', the "
                             "Findings tab or the REST API): the address printed at start opens it")
    parser.add_argument("--no-findings-scan", action="store_true",
                        help="scan nothing in the background: the Findings tab and the graph's badges show only "
                             "what 'comgra scan PATH' saved in the recording")
    return parser


def _version() -> str:
    from comgra._version import __version__
    return __version__


def _view_link(text: str) -> str:
    if not text.startswith("/?") and text != "/":
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a view link; it starts with '/?', e.g. "
                                         "'/?tab=findings'")
    return text


def _demo_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comgra demo",
                                     description="Record a short run of the tutorial network (needs torch), then open it.")
    parser.add_argument("--steps", type=positive_int, default=DEMO_STEPS,
                        help=f"training steps per trial (default: {DEMO_STEPS}: enough for the tutorial's bug to be the "
                             "first finding; see benchmarks/demo_fresh_clone.py for how long it takes)")
    add_path(parser, "root folder for the recording (default: a new temporary folder)", required=False)
    _add_server_options(parser)
    return parser



def _serve(args: argparse.Namespace) -> int:
    path = chosen_path(args)
    if args.use_path_for_test_run == (path is not None):
        raise UsageError("give the path of a recording (comgra ROOT/GROUP) or --use-path-for-test-run, one of them.")
    use_arrow_pool_that_gives_back()  # before pyarrow loads (see there), after a usage error, which imports nothing
    group = check_recording(_test_run_path() if args.use_path_for_test_run or path is None else path)
    from comgra.server.app import limit_malloc_arenas
    from comgra.server.heap import keep_heap_small
    limit_malloc_arenas()  # before any thread: see there
    keep_heap_small()  # glibc's freed memory goes back (server/heap.py)
    _repair_closed_trials(group)
    visualization = args.visualization_file
    if visualization is None and args.use_path_for_test_run:  # the tutorial comes with its visualization
        visualization = bundled_visualization()
    if visualization is not None and not visualization.is_file():
        raise UsageError(f"the visualization file {str(visualization)!r} does not exist.")
    from comgra.config import load_settings
    from comgra.errors import ConfigError
    try:
        settings = load_settings(args.config)
        if settings.ignored:
            print(f"comgra: not reading {settings.ignored!r}: it lies inside a recording, and a recording's files are "
                  "data, not your settings (pass --config to read it anyway)", file=sys.stderr)
        if settings.anomalies.detectors:  # user detectors: the Findings tab and the REST API run them too
            from comgra.analysis.custom import load_configured

            load_configured(settings.anomalies.detectors)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    return _run_server(group, host=args.host, port=args.port, visualization_file=visualization,
                       allow_hosts=args.allow_host, poll_seconds=settings.app.refresh_interval_s, view=args.view,
                       findings_sensitivity=settings.anomalies.sensitivity, findings_scan=not args.no_findings_scan,
                       doors=_doors(args, settings))


def _doors(args: argparse.Namespace, settings: object = None) -> dict[str, bool]:
    """The token settings: the command line wins over comgra.toml's [app] section."""
    app = getattr(settings, "app", None)
    token = not args.no_token if args.no_token is not None else bool(getattr(app, "token", True))
    reads = args.token_for_reads if args.token_for_reads is not None else bool(getattr(app, "token_for_reads", False))
    return {"token": token, "token_for_reads": reads}


def _repair(arguments: list[str]) -> int:
    from comgra.cli import repair

    try:
        lines = repair.main(arguments)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print("\n".join(terminal.printable(line) for line in lines))
    return 0


def _migrate(command: str, arguments: list[str]) -> int:
    from comgra.cli import migrate

    try:
        lines = migrate.main(command, arguments)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print("\n".join(lines))
    return 0


def _repair_closed_trials(group: Path | str) -> None:
    """Make the plain read of closed or crashed trials exact once the app has opened them (live ones are skipped)."""
    import os

    if isinstance(group, str):  # a URL: read through a mirror; 'comgra repair URL' repairs the store itself
        return
    from comgra.store.repair import repair_group

    if not os.access(group, os.W_OK):
        return
    try:
        repairs = repair_group(group)
    except OSError as error:  # a read-only file or a folder that vanished: the app still serves
        print(f"comgra: could not repair {str(group)!r} ({terminal.printable(error)}); plain Parquet readers may "
              "see leftovers",
              file=sys.stderr)
        return
    for repair in repairs:
        if repair.fixed:
            print(f"comgra: repaired {terminal.printable(repair.describe())}", file=sys.stderr)


def bundled_visualization() -> Path:
    """The example that plots helper_partial_sums of the tutorial across iterations."""
    spec = importlib.util.find_spec("comgra.examples.custom_visualization")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def _test_run_path() -> Path:
    from comgra.cli.paths import default_test_run_group_path

    path = default_test_run_group_path()
    if not (path / "trials").is_dir():
        raise UsageError(f"there is no test run in {str(path)!r} yet. Record one with: comgra-test-run")
    return path


def _run_server(group: Path | str, *, host: str, port: int, visualization_file: Path | None,
                allow_hosts: list[str] | None = None, poll_seconds: float = 2.0,
                findings_sensitivity: float | None = None, findings_scan: bool = True, view: str = "/",
                doors: dict[str, bool] | None = None) -> int:
    from comgra.errors import ConfigError, StoreError
    from comgra.server.app import create_app, make_http_server

    try:
        app = create_app(group, visualization_file=visualization_file, poll_seconds=max(0.2, poll_seconds),
                         findings_sensitivity=findings_sensitivity, findings_scan=findings_scan, scan_in_child=True)
        server = make_http_server(app, host=host, port=port, allow_hosts=allow_hosts or (), **(doors or {}))
    except (StoreError, ConfigError) as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot serve on {host}:{port} ({error.strerror or error}); try another --port.") from None
    _announce(app, server, group, view)
    global _SERVED
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("comgra: stopped", file=sys.stderr)
    finally:
        server.server_close()
        _SERVED = True
    return 0


def _announce(app: Any, server: Any, group: Path | str, view: str) -> None:
    """The addresses to open, each with its ``?token=`` (the browser keeps it as a cookie), and the API's token."""
    from comgra.server.app import start_links

    links = start_links(app, server, view)
    print(f"comgra: serving {terminal.printable(group)}\ncomgra: open {links[0]} in a browser (Ctrl+C to stop)", flush=True)
    for other in links[1:]:
        print(f"comgra: or, on this machine, {other}", flush=True)
    token = app.server.config.get("COMGRA_API_TOKEN")
    if token:  # every state-changing call needs it, on loopback too
        print(f"comgra: token for the REST API (Authorization: Bearer ...): {token}", flush=True)
    else:
        print("comgra: serving without a token (--no-token): any user of this machine can change a paused run",
              flush=True)


def _demo(args: argparse.Namespace) -> int:
    """Bind the port, serve the (empty) group at once, record the tutorial into it in a child process."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError("comgra demo trains a small network and needs PyTorch: pip install 'comgra[torch]'")
    import threading

    from comgra.cli import demo
    from comgra.errors import ConfigError, StoreError
    use_arrow_pool_that_gives_back()
    from comgra.server.app import create_app, limit_malloc_arenas, make_http_server
    from comgra.server.heap import keep_heap_small

    limit_malloc_arenas()
    keep_heap_small()
    chosen = chosen_path(args)
    if isinstance(chosen, str):  # the demo records on this machine; a URL is for recordings made elsewhere
        raise UsageError(f"comgra demo records into a local folder, not {chosen!r}; give a folder, or none.")
    root = chosen.expanduser().resolve() if chosen else Path(tempfile.mkdtemp(prefix="comgra-demo-"))
    group = root / DEMO_GROUP
    if (group / "trials").is_dir() and any((group / "trials").iterdir()):
        raise UsageError(f"{str(group)!r} already holds a recording. Open it with "
                         f"'comgra {group}', or choose another --path.")
    (group / "trials").mkdir(parents=True, exist_ok=True)
    try:  # the port first: a busy one fails now, with nothing recorded
        app = create_app(group, visualization_file=bundled_visualization(), poll_seconds=1.0, scan_in_child=True)
        server = make_http_server(app, host=args.host, port=args.port, allow_hosts=args.allow_host or (), **_doors(args))
    except (StoreError, ConfigError) as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot serve on {args.host}:{args.port} ({error.strerror or error}); try another "
                         "--port. Nothing was recorded.") from None
    # About 30 recorded steps per trial: the tutorial has 12 types of step, each recorded at
    # most once per this many steps.
    difference = max(1, args.steps * 2 // 5)
    print(f"comgra: recording {args.steps} training steps per trial into {group}; the app fills in as it records",
          file=sys.stderr, flush=True)
    child = demo.record_in_child(root, args.steps, difference)
    done = threading.Event()
    demo.watch_child(child, group, done)
    _announce(app, server, group, "/")
    global _SERVED
    try:
        server.serve_forever()  # Werkzeug's: Ctrl+C ends it without raising
    except KeyboardInterrupt:
        pass
    finally:
        demo.stop_child(child, done)
        server.server_close()
        _SERVED = True
        print(f"comgra: stopped; {demo.reopen_hint(group)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    run()
