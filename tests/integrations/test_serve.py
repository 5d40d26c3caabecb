"""comgra.serve and comgra.show from a plain Python process: one app per group folder, a free port, errors
that name the fix."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.compute as pc
import pytest

pytest.importorskip("torch")
import torch

import comgra
from comgra.errors import ConfigError, StoreError


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - the app this test started, on loopback
        assert response.status == 200
        return json.loads(response.read())


@pytest.fixture
def group(make_recorder, store_root: Path, tiny_model) -> Path:
    recorder = make_recorder({0})
    recorder.start_batch(0, 2)
    recorder.start_iteration()
    x = torch.ones(2, 3)
    recorder.register_tensor("x", x, is_input=True)
    recorder.register_tensor("y", tiny_model(x))
    recorder.finish_iteration()
    recorder.finish_batch()
    recorder.finalize()
    return store_root / "group"


def test_serve_reuses_the_running_app_and_replaces_it_for_other_options(group: Path) -> None:
    url = comgra.serve(group, findings_scan=False)
    try:
        assert isinstance(url, str) and url.startswith("http://127.0.0.1:")
        assert _get_json(url.base + "api/v1/trials") == {"trials": ["trial"]}
        assert comgra.serve(str(group) + "/", findings_scan=False) == url  # the same folder, written another way
        other = comgra.serve(group, findings_scan=False, poll_seconds=5.0)  # other options: a new app in its place
        assert other != url
        with pytest.raises(urllib.error.URLError):
            _get_json(url.base + "api/v1/trials")
        assert url.stop() is False  # it was stopped when it was replaced
        assert _get_json(other.base + "api/v1/trials") == {"trials": ["trial"]}
    finally:
        comgra.serve(group, findings_scan=False, poll_seconds=5.0).stop()


def test_serve_without_a_path_serves_the_recorders_group_with_its_steps_so_far(make_recorder, store_root,
                                                                            tiny_model) -> None:
    comgra.my_recorder = make_recorder({0, 1}, flush_seconds=60.0)
    for step in (0, 1):
        comgra.my_recorder.start_batch(step, 2)
        comgra.my_recorder.start_iteration()
        x = torch.full((2, 3), float(step))
        comgra.my_recorder.register_tensor("x", x, is_input=True)
        comgra.my_recorder.register_tensor("y", tiny_model(x))
        comgra.my_recorder.finish_iteration()
        comgra.my_recorder.finish_batch()
    url = comgra.serve(findings_scan=False)  # flushed first: both steps are readable though flush_seconds is 60
    try:
        steps = _get_json(url.base + "api/v1/trials/trial/steps")["steps"]
        assert sorted({row["training_step"] for row in steps}) == [0, 1]
    finally:
        url.stop()


def test_a_port_asked_for_is_used_and_a_busy_one_is_an_error_naming_the_fix(group: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    url = comgra.serve(group, port=free, findings_scan=False)
    try:
        assert url.base == f"http://127.0.0.1:{free}/" and url == f"{url.base}?token={url.token}"
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            with pytest.raises(ConfigError, match=r"cannot serve on 127\.0\.0\.1:\d+ .*port=None for a free one"):
                comgra.serve(group, port=busy.getsockname()[1], findings_scan=False)
    finally:
        url.stop()


def test_served_beyond_loopback_the_url_carries_the_token(group: Path) -> None:
    url = comgra.serve(group, host="0.0.0.0", findings_scan=False)
    try:
        base, token = url.split("?token=")
        assert len(token) >= 24 and base.endswith("/")
        request = urllib.request.Request(base + "api/v1/trials/trial/run/continue", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:  # a state-changing call without the token
            urllib.request.urlopen(request, timeout=60)  # noqa: S310 - the app this test started
        assert refused.value.code == 401
        refused.value.close()  # its answer's socket
    finally:
        url.stop()


@pytest.mark.parametrize(("port", "match"), [(-1, "port=-1 is not a port"), (70000, "port=70000"),
                                             ("8055", "port='8055'"), (True, "port=True")])
def test_a_bad_port_is_a_config_error(group: Path, port: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        comgra.serve(group, port=port)  # type: ignore[arg-type]


def test_the_root_folder_instead_of_the_group_folder_gets_an_error_naming_the_group(group: Path) -> None:
    with pytest.raises(StoreError, match=r"not the group folder .* It holds the groups \['group'\]: pass e\.g\."):
        comgra.serve(group.parent)
    with pytest.raises(StoreError, match=r"It is the folder of trial 'trial': pass its group, '.*/group'\."):
        comgra.serve(group / "trials" / "trial")
    with pytest.raises(StoreError, match="the folder does not exist"):
        comgra.serve(group / "nothing here")


def test_serve_without_a_path_and_without_a_recorder_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comgra, "my_recorder", None)
    with pytest.raises(ConfigError, match="comgra.my_recorder is None; pass the group folder"):
        comgra.serve()


def test_show_outside_a_notebook_says_to_use_serve(group: Path) -> None:
    with pytest.raises(ConfigError, match=r"comgra\.show\(\) shows the app in a Jupyter notebook.*"
                                          r"comgra\.serve\(path\)"):
        comgra.show(group)


def test_an_open_app_shows_the_new_run_when_the_recorder_cell_runs_again(make_recorder, store_root,
                                                                        tiny_model) -> None:
    """Both runs write the same chunk names (one flush each, at finalize): what the app's service keeps of the
    first run must not answer for the second."""
    from comgra.service import RecordingService

    def run(value: float) -> None:
        recorder = make_recorder({0, 1}, flush_seconds=60.0)
        for step in (0, 1):
            recorder.start_batch(step, 2)
            recorder.start_iteration()
            x = torch.full((2, 3), value + step)
            recorder.register_tensor("x", x, is_input=True)
            recorder.register_tensor("y", tiny_model(x))
            recorder.finish_iteration()
            recorder.finish_batch()
        recorder.finalize()

    def x_means(service: RecordingService, trial_id: str = "trial") -> list[float]:
        return [service.step_rows(trial_id, step, 0).filter(
            (pc.field("node") == "x") & (pc.field("aggregation") == "mean") & (pc.field("kind") == "forward")
        )["mean"][0].as_py() for step in (0, 1)]

    run(1.0)
    service = RecordingService(store_root / "group")
    try:
        assert x_means(service) == [1.0, 2.0]
        chunks = service.step_index("trial").chunks
        run(10.0)
        assert service.trials() == ["trial", "trial~1"]
        assert service.step_index("trial").chunks == chunks  # the same names, another run
        assert x_means(service) == [10.0, 11.0]
        assert x_means(service, "trial~1") == [1.0, 2.0]
    finally:
        service.close()
