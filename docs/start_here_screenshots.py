"""The screenshots of the README and docs/app.md ("Start here"), taken in Chromium at 1280x800 on a demo recording.

    python docs/start_here_screenshots.py RECORDING_GROUP [OUT_DIR]   # default OUT_DIR: docs/images

RECORDING_GROUP is what ``comgra demo --path P`` recorded (``P/demo``). Needs Playwright and Debian's Chromium.
Into the default folder it also writes ``manifest.json``: a hash of the code that draws what the pictures
show (the app's ``server`` package and the tutorial network) and of each picture; ``tests/test_docs.py``
fails when that code changed since, so that the pictures are retaken.
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = Path(__file__).parent / "images"
MANIFEST = IMAGES / "manifest.json"
# What the pictures show is drawn by these: a change to any of them makes the pictures stale.
SOURCES = ("src/comgra/server", "src/comgra/examples/tutorial.py")


def sources_digest(root: Path = ROOT) -> str:
    """SHA-256 over the paths and bytes of the files of SOURCES (sorted, ``__pycache__`` left out)."""
    digest = hashlib.sha256()
    for source in SOURCES:
        top = root / source
        files = sorted(top.rglob("*")) if top.is_dir() else [top]
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def write_manifest(out: Path) -> None:
    images = {image.name: hashlib.sha256(image.read_bytes()).hexdigest() for image in sorted(out.glob("*.png"))}
    (out / "manifest.json").write_text(json.dumps({"sources": sources_digest(), "images": images}, indent=1) + "\n")

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def main(group: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    from comgra.server.app import create_app, make_http_server, url_of

    out.mkdir(parents=True, exist_ok=True)
    server = make_http_server(create_app(group, poll_seconds=60), host="127.0.0.1", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = url_of(server)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
            page.set_default_timeout(60_000)
            page.goto(url)
            page.wait_for_selector(".start-here-box")
            page.wait_for_selector("#dependency-graph .graph-node.selected")
            page.screenshot(path=str(out / "start-here-0-first-view.png"))
            for number, ready in (("1", "#findings-list .finding"), ("2", "#dependency-graph .graph-node.selected"),
                                  ("3", "#series-plot .js-plotly-plot .main-svg")):
                page.goto(url)
                page.locator(f'.start-here-step[data-step="{number}"] a').click()
                page.wait_for_selector(ready)
                page.wait_for_timeout(2500)  # the plots and the scroll settle
                page.screenshot(path=str(out / f"start-here-{number}.png"))
            browser.close()
    finally:
        server.shutdown()
    write_manifest(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else IMAGES)
