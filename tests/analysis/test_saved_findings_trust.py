"""Saved findings are a cache, not a verdict (issue 31 item 8): a findings file edited by hand (a forged message,
the real NaN finding deleted), copied from someone else (signed with another user's key) or from another trial,
or one whose chunks were replaced, is computed again; what ``comgra scan`` prints and the app serves is what the
data says."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from planted import Network, mlp, record  # noqa: E402

from comgra.analysis import Scanner, saved  # noqa: E402
from comgra.service import RecordingService  # noqa: E402


def _nan_in_layer1_at_step_6(step, name, h):
    if step == 6 and name == "layer1":
        h = h.clone()
        h[3, 0] = float("nan")
    return h


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    record(root, "nan", Network(mlp(4, 8, 8, 1), steps=10, inject=_nan_in_layer1_at_step_6))
    return record(root, "other", Network(mlp(4, 8, 8, 1), steps=10, inject=_nan_in_layer1_at_step_6), seed=1)


@pytest.fixture
def group(recorded, tmp_path):
    copy = tmp_path / "group"
    shutil.copytree(recorded, copy)
    return copy


def _scan_json(group, *extra) -> list[dict]:
    """``comgra scan --json`` as a user runs it (a real process, the session's key folder inherited)."""
    answer = subprocess.run([sys.executable, "-m", "comgra.cli.app", "scan", "--path", str(group), "--json", *extra],
                            capture_output=True, text=True, timeout=600, check=False)
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)["findings"]


def _saved_file(group, trial="nan"):
    (path,) = sorted(group.glob(f"trials/{trial}/{saved.FOLDER}/*.json"))
    return path


def _key(finding: dict) -> tuple:
    return finding["trial"], finding["detector"], finding["node"], finding["training_step"], finding["message"]


def _edit(path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_an_edited_message_is_computed_again(group, counted_scans) -> None:
    truth = _scan_json(group)
    assert any(f["detector"] == "non_finite" and f["trial"] == "nan" for f in truth)
    path = _saved_file(group)

    def forge(document):
        for finding in document["findings"]:
            finding["message"] = "All is well. Nothing to see here."
    _edit(path, forge)
    printed = _scan_json(group)
    assert sorted(map(_key, printed)) == sorted(map(_key, truth))
    assert not any("All is well" in f["message"] for f in printed)
    assert "All is well" not in path.read_text()  # computed again, and the cache written anew
    counted_scans.clear()
    assert sorted(f.message for f in Scanner(persist=True).scan(group).findings) == sorted(f["message"] for f in truth)
    assert counted_scans == []  # the rewritten file verifies


def test_a_deleted_nan_finding_comes_back_in_the_scan_and_in_the_app(group) -> None:
    truth = _scan_json(group)
    nan_findings = [f for f in truth if f["detector"] == "non_finite" and f["trial"] == "nan"]
    assert nan_findings
    _edit(_saved_file(group), lambda d: d.update(findings=[f for f in d["findings"] if f["detector"] != "non_finite"]))
    service = RecordingService(group)
    try:
        served = service.finding_documents("nan")
    finally:
        service.close()
    assert {_key(f) for f in nan_findings} <= {_key(f) for f in served}
    assert {_key(f) for f in nan_findings} <= {_key(f) for f in _scan_json(group)}


def test_findings_signed_by_someone_else_are_computed_again(group, tmp_path, monkeypatch, counted_scans) -> None:
    mine = os.environ["COMGRA_CONFIG_DIR"]
    monkeypatch.setenv("COMGRA_CONFIG_DIR", str(tmp_path / "someone_else"))
    Scanner(persist=True).scan(group)  # the recording as it arrives, with its sender's saved findings
    monkeypatch.setenv("COMGRA_CONFIG_DIR", mine)
    counted_scans.clear()
    Scanner(persist=True).scan(group)
    assert sorted(counted_scans) == ["nan", "other"]
    counted_scans.clear()
    Scanner(persist=True).scan(group)
    assert counted_scans == []  # now signed with this user's key


def test_findings_copied_from_another_trial_or_over_other_data_are_computed_again(group, counted_scans) -> None:
    Scanner(persist=True).scan(group)
    shutil.copy(_saved_file(group, "other"), _saved_file(group, "nan"))  # another trial's (signed) answer
    counted_scans.clear()
    Scanner(persist=True).scan(group)
    assert counted_scans == ["nan"]
    tensors = sorted(p for p in group.rglob("*.parquet") if "tensors" in p.parts and "nan" in str(p))[0]
    stamp = tensors.stat()
    os.utime(tensors, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # a chunk replaced under the same name
    counted_scans.clear()
    Scanner(persist=True).scan(group)
    assert counted_scans == ["nan"]


def test_the_key_is_private_to_the_user(group) -> None:
    from comgra.analysis import findings_key

    Scanner(persist=True).scan(group, trials=["nan"])
    path = findings_key.key_path()
    assert path.parent == __import__("pathlib").Path(os.environ["COMGRA_CONFIG_DIR"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == findings_key.KEY_BYTES


def test_a_key_others_can_read_is_not_trusted(tmp_path, monkeypatch, caplog) -> None:
    from comgra.analysis import findings_key

    folder = tmp_path / "shared_config"
    folder.mkdir()
    (folder / findings_key.KEY_FILE).write_bytes(b"k" * findings_key.KEY_BYTES)
    (folder / findings_key.KEY_FILE).chmod(0o644)
    monkeypatch.setenv("COMGRA_CONFIG_DIR", str(folder))
    forged = __import__("hmac").new(b"k" * findings_key.KEY_BYTES, b"content", "sha256").hexdigest()
    assert not findings_key.verify(b"content", forged)
    assert "read or written by others" in caplog.text
