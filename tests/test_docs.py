"""The documentation: the MkDocs site builds with warnings and broken links as errors, no tracked file holds
merge-conflict markers, the README stays a front page whose links lead into the site, and the screenshots
were taken by docs/start_here_screenshots.py from the code that draws the app now."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("<" * 7, ">" * 7)  # spelled out here, this file would hold what it looks for


def _mkdocs(tmp_path: Path, project: Path = ROOT) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_the_generated_references(tmp_path: Path) -> None:
    result = _mkdocs(tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    rest = (site / "reference" / "rest" / "index.html").read_text()
    from comgra.server.api_spec import openapi_document
    for path in openapi_document()["paths"]:  # every route of the OpenAPI document has its section
        assert path.replace("{", "").replace("}", "") in re.sub(r"[{}]", "", rest), path
    python = (site / "reference" / "python" / "index.html").read_text()
    for name in ("register_tensor", "record_current_gradients", "ComgraRecorder", "DecisionMakerForRecordingsHardcoded",
                 "ScanOptions", "register_detector", "watch"):
        assert name in python, name
    assert "<<<<" not in (site / "findings" / "index.html").read_text()


def test_a_broken_link_fails_the_build_and_a_page_missing_from_the_nav_is_added(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (project / "docs" / "another-branch.md").write_text("# Sweeps\n\nA page another branch brings.\n")
    result = _mkdocs(tmp_path, project)
    assert result.returncode == 0, result.stderr[-4000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "another-branch/" in index and "More" in index  # listed in the nav, under More
    (project / "docs" / "another-branch.md").write_text("# Sweeps\n\nSee [the store](store.md#no-such-section) and [x](gone.md).\n")
    result = _mkdocs(tmp_path, project)
    assert result.returncode != 0 and "gone.md" in result.stderr


def test_no_tracked_file_holds_merge_conflict_markers() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    pattern = rf"^({MARKERS[0]}|{MARKERS[1]})( |$)"
    found = subprocess.run(["git", "grep", "-n", "-I", "-E", pattern], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1, f"merge-conflict markers in tracked files:\n{found.stdout[:4000]}"


def test_the_conflict_check_sees_a_planted_marker(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.md").write_text(f"x\n{MARKERS[0]} HEAD\na\n=======\nb\n{MARKERS[1]} other\n")
    subprocess.run(["git", "add", "a.md"], cwd=tmp_path, check=True)
    pattern = rf"^({MARKERS[0]}|{MARKERS[1]})( |$)"
    found = subprocess.run(["git", "grep", "-n", "-I", "-E", pattern], cwd=tmp_path, capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout.count("a.md:") == 2


def test_the_readme_is_a_front_page_whose_links_lead_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 100, "the README is one or two screens; the rest belongs in docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not t.startswith("http")]
    assert any(t.startswith("docs/") and t.endswith(".md") for t in local)
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text()
    for target in local:
        if target.startswith("docs/") and target.endswith(".md"):
            assert target.removeprefix("docs/") in nav, f"{target} is linked from the README but not in the nav"


def test_the_screenshots_are_current() -> None:
    spec = importlib.util.spec_from_file_location("start_here_screenshots", ROOT / "docs" / "start_here_screenshots.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    manifest = json.loads(script.MANIFEST.read_text())
    for name, digest in manifest["images"].items():
        assert hashlib.sha256((script.IMAGES / name).read_bytes()).hexdigest() == digest, \
            f"docs/images/{name} was changed by hand; retake it with docs/start_here_screenshots.py"
    used = set(re.findall(r"images/([\w.-]+\.png)", (ROOT / "README.md").read_text() + "".join(
        page.read_text() for page in (ROOT / "docs").rglob("*.md"))))
    assert used and used <= set(manifest["images"]), sorted(used - set(manifest["images"]))
    assert manifest["sources"] == script.sources_digest(), (
        "the app's code changed since the screenshots were taken: `comgra demo --path /tmp/d --no-serve` (or any "
        "demo recording), then `python docs/start_here_screenshots.py /tmp/d/demo`, and commit docs/images")
