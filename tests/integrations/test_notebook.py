"""A real notebook on a real IPython kernel (nbclient): record, run the recorder cell again, raise inside a step
and abandon it, serve the app and show it inline; then the test reads the store and the served app itself."""
from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

import torch

import comgra
from comgra.server.ids import ID
from comgra.store import GroupReader

pytestmark = pytest.mark.slow

SETUP = """
import json
import torch
import comgra
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

ROOT = {root!r}
GROUP = ROOT + "/group"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
run = 0

def inputs(run, step):
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(1000 * run + step))

def train_step(step, x):
    recorder = comgra.my_recorder
    recorder.start_iteration()
    recorder.register_tensor("x", x, is_input=True)
    y = model(x)
    recorder.register_tensor("y", y)
    loss = y.pow(2).mean()
    recorder.register_tensor("loss", loss, is_loss=True)
    optimizer.zero_grad()
    loss.backward()
    recorder.record_current_gradients("gradients")
    optimizer.step()
    recorder.finish_iteration()
"""
# flush_seconds=60: the steps are still in the writer's buffer when the cell runs again (the case that lost them)
RECORDER = """
run += 1
comgra.my_recorder = ComgraRecorder(ROOT, "group", "trial",
                                    DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1),
                                    flush_seconds=60.0)
comgra.my_recorder.track_module("model", model)
"""
LOOP = """
for step in range(2):
    with comgra.my_recorder.batch(step, 4):
        train_step(step, inputs(run, step))
"""
RAISES = """
comgra.my_recorder.start_batch(2, 4)
comgra.my_recorder.start_iteration()
comgra.my_recorder.register_tensor("x", inputs(run, 99), is_input=True)
raise RuntimeError("a bug in the middle of step 2")
"""
ABANDON = """
print("abandoned:", comgra.my_recorder.abandon_step())
with comgra.my_recorder.batch(2, 4):
    train_step(2, inputs(run, 2))
try:
    with comgra.my_recorder.batch(3, 4):
        comgra.my_recorder.start_iteration()
        comgra.my_recorder.register_tensor("x", inputs(run, 98), is_input=True)
        raise ValueError("caught: the with block abandoned step 3")
except ValueError:
    pass
with comgra.my_recorder.batch(3, 4):
    train_step(3, inputs(run, 3))
"""
SERVE = """
url = comgra.serve()  # comgra.my_recorder's group, flushed first
print(json.dumps({"url": url, "again": comgra.serve(GROUP)}))
"""
STOP = """
print(json.dumps({"stopped": url.stop(), "stopped_twice": url.stop()}))
url = comgra.serve(GROUP)
print(json.dumps({"url": url}))
"""
SHOW = """
comgra.show(GROUP, height=500)
"""
FINISH = """
comgra.my_recorder.finalize()
"""
CELLS = [("setup", SETUP), ("recorder", RECORDER), ("loop", LOOP), ("raises", RAISES),
         ("recorder", RECORDER), ("loop", LOOP), ("raises", RAISES), ("abandon", ABANDON),
         ("serve", SERVE), ("stop", STOP), ("show", SHOW), ("finish", FINISH)]


def _inputs(run: int, step: int) -> torch.Tensor:
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(1000 * run + step))


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - the app this test started, on loopback
        return response.status, response.read()


def _printed(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _x_means(group: GroupReader, trial_id: str) -> dict[int, float]:
    trial = group.trial(trial_id)
    steps = sorted(set(trial.steps()["training_step"].to_pylist()))
    return {s: trial.selection(training_step=s, node="x", kind="forward", aggregation="mean")["mean"][0].as_py()
            for s in steps}


def test_a_notebook_records_runs_its_recorder_cell_again_abandons_a_step_and_shows_the_app(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "store"
    root.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(Path(comgra.__file__).resolve().parents[1]))  # this comgra in the kernel
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    notebook = nbformat.v4.new_notebook()
    for name, source in CELLS:
        cell = nbformat.v4.new_code_cell(textwrap.dedent(source.format(root=str(root)) if name == "setup"
                                                         else source).strip())
        cell.metadata["tags"] = ["raises-exception"] if name == "raises" else []
        cell.metadata["name"] = name
        notebook.cells.append(cell)
    client = nbclient.NotebookClient(notebook, kernel_name="python3", timeout=180,
                                     resources={"metadata": {"path": str(tmp_path)}})
    seen: dict[str, Any] = {}
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
            seen.setdefault(cell.metadata["name"], []).append(cell)
            if cell.metadata["name"] == "serve":
                served = json.loads(_printed(cell))
                seen["served"] = _check_the_served_app(served["url"])
                assert served["again"] == served["url"]  # a second serve of the same folder: the running app
            elif cell.metadata["name"] == "stop":
                first, printed = _printed(cell).splitlines()
                assert json.loads(first) == {"stopped": True, "stopped_twice": False}
                with pytest.raises(urllib.error.URLError):
                    _get(seen["served"])  # stopped: nothing answers there any more
                seen["url"] = json.loads(printed)["url"]
                assert _get(seen["url"])[0] == 200

    for cell in seen["raises"]:
        assert [o.ename for o in cell.outputs if o.output_type == "error"] == ["RuntimeError"]
    errors = [o for cells in seen.values() if isinstance(cells, list) for c in cells for o in c.outputs
              if o.output_type == "error" and c.metadata["name"] != "raises"]
    assert errors == []
    stderr = "".join(o.text for c in seen["recorder"] for o in c.outputs if o.output_type == "stream")
    assert "that recording is kept as trial 'trial~1'" in stderr and "Warning" not in stderr
    assert _printed(seen["abandon"][0]).startswith("abandoned: True")

    (show,) = seen["show"]
    (html,) = [o.data["text/html"] for o in show.outputs if o.output_type == "display_data"]
    assert "<iframe" in html and f'src="{seen["url"]}"' in html and 'height="500"' in html

    group = GroupReader(root / "group")
    assert group.trials() == ["trial", "trial~1"]
    # The first run: its two steps, kept when the recorder cell ran again; its half step 2 is not there.
    assert _x_means(group, "trial~1") == pytest.approx({s: _inputs(1, s).mean().item() for s in (0, 1)})
    # The second run: steps 0-3, step 2 and 3 as recorded after the abandoned attempts, none of those attempts.
    assert _x_means(group, "trial") == pytest.approx({s: _inputs(2, s).mean().item() for s in range(4)})


def _ids(node: Any) -> set[str]:
    """The component ids in a Dash layout (JSON)."""
    if isinstance(node, list):
        return set().union(*(_ids(child) for child in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    props = node.get("props", {})
    own = {props["id"]} if isinstance(props.get("id"), str) else set()
    return own.union(*(_ids(value) for value in props.values()))


def _check_the_served_app(url: str) -> str:
    """The app answers at ``url``: its page, its layout, and the REST API (from the same service) sees both runs."""
    assert url.startswith("http://127.0.0.1:") and "/?token=" in url  # the link carries the token (issue 31 item 5)
    status, page = _get(url)
    url = url.split("?")[0]
    assert status == 200 and b"_dash-config" in page
    status, layout = _get(url + "_dash-layout")
    assert status == 200 and {ID.CURRENT_TRIAL, ID.DATA_VERSION} <= _ids(json.loads(layout))
    status, trials = _get(url + "api/v1/trials")
    assert status == 200 and json.loads(trials)["trials"] == ["trial", "trial~1"]
    status, steps = _get(url + "api/v1/trials/trial/steps")
    assert sorted({row["training_step"] for row in json.loads(steps)["steps"]}) == [0, 1, 2, 3]
    return url

