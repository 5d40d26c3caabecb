"""The public surface is a visible decision: this test lists it, so a new name fails here first."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import comgra
import comgra.objects

PUBLIC = {
    "comgra": ["ComgraError", "TrainingAborted", "__version__", "my_recorder", "serve", "show", "watch"],
    "comgra.recorder": ["ComgraRecorder"],
    "comgra.objects": ["DecisionMakerForRecordings", "DecisionMakerForRecordingsFrequencyPerType",
                       "DecisionMakerForRecordingsHardcoded"],
    # The findings API; scan_trial/trial_ids/TrialScan: the per-trial scan an engine maps over a sweep (issue 30).
    "comgra.analysis": ["DETECTORS", "FORMAT_VERSION", "SEVERITIES", "Finding", "ScanOptions", "ScanResult", "Scanner",
                        "TrialScan", "detect_all", "document", "rank_findings", "register_detector", "scan_trial",
                        "trial_ids", "unregister_detector"],
}

# The methods of the original Comgra 0.11.5, with their parameter names in order.
RECORDER_METHODS = {
    "__init__": ["comgra_root_path", "group", "trial_id", "decision_maker_for_recordings",
                 "max_num_batch_size_to_record", "prefixes_for_grouping_module_parameters_visually",
                 "prefixes_for_grouping_module_parameters_in_nodes", "comgra_is_active",
                 "max_num_mappings_to_save_at_once_during_serialization", "type_of_serialization",
                 "calculate_svd_and_other_expensive_operations_of_parameters",
                 # ours, keyword-only:
                 "max_num_neurons_to_record", "flush_seconds", "record_ranks",
                 "profile_history", "profile_flops_every", "profile_every", "resource_seconds",  # profiling (issue 9)
                 "breakpoints", "config"],  # breakpoints and comgra.toml (issue 9)
    "recording_is_active": [],
    "track_module": ["module_name", "module", "profile"],
    "get_name_of_module": ["module"],
    "add_note": ["note"],
    "start_batch": ["training_step", "current_batch_size", "type_of_execution",
                    "record_all_tensors_per_batch_index_by_default", "override__recording_is_active"],
    "start_iteration": [],
    "register_tensor": ["tensor_name", "tensor", "index_of_batch_dimension", "is_input", "is_parameter", "is_target",
                        "is_loss", "recording_type", "record_per_batch_index", "node_name", "role_within_node",
                        "is_initial_value"],
    "add_tensor_connection": ["src", "sink"],
    "detach_while_keeping_connection": ["tensor"],
    "declare_that_all_different_types_of_execution_have_been_encountered": [],
    "decide_recording_of_batch": ["type_of_execution", "category_per_sample"],
    "record_current_gradients": ["name_of_loss_group", "set_gradients_to_zero_if_not_a_parameter",
                                 "scaler", "loss_scale"],  # ours, keyword-only: loss scaling (issue 23)
    "finish_iteration": [],
    "finish_batch": [],
    "finalize": [],
    "flush": ["timeout"],  # ours: make a run in progress readable up to now (issue 6)
    "track_optimizer": ["optimizer"],  # ours: the optimizer's parameter groups on recorded steps (issue 24)
    "set_sentinels": ["names", "enabled", "pause_on_error"],  # ours: the every-step sentinels (issue 24)
    "abandon_step": [],  # ours: drop a step an exception interrupted (issue 23, notebooks)
    "batch": ["training_step", "current_batch_size", "type_of_execution",  # ours: start_batch ... finish_batch
              "record_all_tensors_per_batch_index_by_default", "override__recording_is_active"],  # as a with block
    "record_kpi_in_graph": ["kpi_group", "kpi_name", "val", "timepoint", "record_even_if_recording_is_inactive"],
    "record_hyperparameters": ["mapping"],  # ours: the trial's hyperparameters for the Runs view (issue 30)
}


def _module(name: str):
    if name == "comgra.recorder":
        pytest.importorskip("torch")
    return __import__(name, fromlist=["_"])


@pytest.mark.parametrize(("module_name", "names"), PUBLIC.items(), ids=PUBLIC.keys())
def test_public_names(module_name: str, names: list[str]) -> None:
    module = _module(module_name)
    assert sorted(module.__all__) == sorted(names)
    for name in names:
        assert hasattr(module, name), name
    defined_here = {name for name, value in vars(module).items()
                    if not name.startswith("_") and getattr(value, "__module__", None) == module_name
                    and (inspect.isclass(value) or inspect.isfunction(value))}
    assert defined_here <= set(names), f"public but not in __all__: {sorted(defined_here - set(names))}"


def test_recorder_methods_match_the_original_api() -> None:
    recorder_module = _module("comgra.recorder")
    cls = recorder_module.ComgraRecorder
    public = {name for name, value in vars(cls).items() if not name.startswith("_") and callable(value)}
    assert public == set(RECORDER_METHODS) - {"__init__"}
    for name, parameters in RECORDER_METHODS.items():
        signature = inspect.signature(getattr(cls, name))
        assert list(signature.parameters)[1:] == parameters, name
    init = inspect.signature(cls.__init__).parameters
    assert init["max_num_neurons_to_record"].kind is inspect.Parameter.KEYWORD_ONLY
    assert init["flush_seconds"].kind is inspect.Parameter.KEYWORD_ONLY
    assert init["record_ranks"].kind is inspect.Parameter.KEYWORD_ONLY
    gradients = inspect.signature(cls.record_current_gradients).parameters
    assert [gradients[n].kind for n in ("scaler", "loss_scale")] == [inspect.Parameter.KEYWORD_ONLY] * 2


def test_defaults_match_the_original_api() -> None:
    cls = _module("comgra.recorder").ComgraRecorder
    start_batch = inspect.signature(cls.start_batch).parameters
    assert start_batch["type_of_execution"].default == "main_execution_type"
    assert start_batch["record_all_tensors_per_batch_index_by_default"].default is True
    assert start_batch["override__recording_is_active"].default is None
    register = inspect.signature(cls.register_tensor).parameters
    assert register["index_of_batch_dimension"].default == 0
    assert inspect.signature(cls.__init__).parameters["comgra_is_active"].default is True


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from comgra import *", namespace)  # noqa: S102 - a fixed string: the star import itself is under test
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(PUBLIC["comgra"])


def test_error_categories_share_one_root() -> None:
    from comgra import errors

    for name in ("RecordingError", "ConfigError", "StoreError", "SelectionError"):
        assert issubclass(getattr(errors, name), comgra.ComgraError)


def test_importing_comgra_changes_nothing() -> None:
    """No torch, no threads, no hooks at import; the store and the policies work without torch."""
    code = (
        "import sys, threading, json\n"
        "before = threading.active_count()\n"
        "import comgra, comgra.objects, comgra.errors, comgra.store\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'threads': threading.active_count() - before,"
        " 'recorder': comgra.my_recorder is None}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(result.stdout) == {"torch": False, "threads": 0, "recorder": True}


def test_objects_keep_the_original_import_path() -> None:
    from comgra.objects import (
        DecisionMakerForRecordingsFrequencyPerType,
        DecisionMakerForRecordingsHardcoded,
    )

    assert issubclass(DecisionMakerForRecordingsHardcoded, comgra.objects.DecisionMakerForRecordings)
    assert issubclass(DecisionMakerForRecordingsFrequencyPerType, comgra.objects.DecisionMakerForRecordings)
