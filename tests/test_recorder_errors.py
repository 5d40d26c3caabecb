"""Bad input raises a ComgraError subclass whose message names the value and the fix."""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from comgra.capture.session import ComgraWarning
from comgra.errors import ComgraError, ConfigError, RecordingError
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType
from comgra.recorder import ComgraRecorder

B = 4


def _x() -> torch.Tensor:
    return torch.ones(B, 3)


def register_before_start_batch(r: ComgraRecorder) -> None:
    r.register_tensor("early", _x())


def register_before_start_iteration(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.register_tensor("early", _x())


def initial_value_inside_an_iteration(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("initial_memory", _x(), is_initial_value=True)


def finish_batch_without_start_batch(r: ComgraRecorder) -> None:
    r.finish_batch()


def finish_iteration_without_start_iteration(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.finish_iteration()


def start_iteration_twice(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.start_iteration()


def start_batch_twice(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_batch(1, B)


def same_name_twice_in_one_iteration(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("hidden", _x())
    r.register_tensor("hidden", _x() * 2)


def same_role_twice_in_one_node(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("a", _x(), node_name="helper", role_within_node="sums")
    r.register_tensor("b", _x(), node_name="helper", role_within_node="sums")


def batch_dimension_mismatch(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("wrong_batch", torch.ones(B + 1, 3))


def batch_dimension_out_of_range(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("flat", torch.ones(B), index_of_batch_dimension=2)


def unknown_recording_type(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("x", _x(), recording_type="neurons")


def two_kinds_of_tensor(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("x", _x(), is_input=True, is_target=True)


def not_a_tensor(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("numbers", [1.0, 2.0])  # type: ignore[arg-type]


def star_in_tensor_name(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("memory*old", _x())


def non_increasing_training_step(r: ComgraRecorder) -> None:
    r.start_batch(5, B)
    r.finish_batch()
    r.start_batch(5, B)


def decreasing_training_step(r: ComgraRecorder) -> None:
    r.start_batch(5, B)
    r.finish_batch()
    r.start_batch(3, B)


def bad_type_of_execution(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution="05 iterations")


def reserved_type_of_execution(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution="any_value")


def dunder_type_of_execution(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution="__internal")


def non_string_type_of_execution(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution=5)  # type: ignore[arg-type]


def gradient_group_named_forward(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.record_current_gradients("forward")


def unknown_connection_source(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.start_iteration()
    r.register_tensor("hidden_state", _x())
    r.add_tensor_connection("hidden_stat", _x())


def finish_dynamic_batch_without_decision(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution=None)
    r.finish_batch()


def wrong_number_of_categories(r: ComgraRecorder) -> None:
    r.start_batch(0, B, type_of_execution=None)
    r.decide_recording_of_batch("main", ["a"] * (B - 1))


def kpi_tensor_with_many_values(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.record_kpi_in_graph("loss", "per_sample", torch.ones(B))


def kpi_that_is_not_a_number(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.record_kpi_in_graph("loss", "text", "0.5")


def track_module_inside_a_step(r: ComgraRecorder) -> None:
    r.start_batch(0, B)
    r.track_module("late", torch.nn.Linear(2, 2))


def track_module_name_with_dot(r: ComgraRecorder) -> None:
    r.track_module("main.model", torch.nn.Linear(2, 2))


def track_module_name_twice(r: ComgraRecorder) -> None:
    r.track_module("model", torch.nn.Linear(2, 2))
    r.track_module("model", torch.nn.Linear(2, 2))


def name_of_untracked_module(r: ComgraRecorder) -> None:
    r.get_name_of_module(torch.nn.Linear(2, 2))


@dataclass
class Case:
    action: Callable[[ComgraRecorder], None]
    error: type[ComgraError]
    names: str  # the offending value, as the message must show it
    fix: str  # a word of the advice


CASES = {
    "register_before_start_batch": Case(register_before_start_batch, RecordingError, "'early'", "start_iteration()"),
    "register_before_start_iteration": Case(register_before_start_iteration, RecordingError, "'early'",
                                            "between start_iteration() and finish_iteration()"),
    "initial_value_inside_an_iteration": Case(initial_value_inside_an_iteration, RecordingError, "'initial_memory'",
                                              "and the first start_iteration()"),
    "finish_batch_without_start_batch": Case(finish_batch_without_start_batch, RecordingError, "finish_batch()",
                                             "start_batch()"),
    "finish_iteration_without_start_iteration": Case(finish_iteration_without_start_iteration, RecordingError,
                                                     "finish_iteration()", "start_iteration()"),
    "start_iteration_twice": Case(start_iteration_twice, RecordingError, "start_iteration()", "finish_iteration()"),
    "start_batch_twice": Case(start_batch_twice, RecordingError, "start_batch(1)", "finish_batch()"),
    "same_name_twice_in_one_iteration": Case(same_name_twice_in_one_iteration, RecordingError, "'hidden'",
                                             "role_within_node"),
    "same_role_twice_in_one_node": Case(same_role_twice_in_one_node, RecordingError, "'sums'", "role_within_node"),
    "batch_dimension_mismatch": Case(batch_dimension_mismatch, RecordingError, "current_batch_size=4",
                                     "index_of_batch_dimension"),
    "batch_dimension_out_of_range": Case(batch_dimension_out_of_range, RecordingError,
                                         "index_of_batch_dimension=2", "index_of_batch_dimension=None"),
    "unknown_recording_type": Case(unknown_recording_type, RecordingError, "'neurons'", "'neuron'"),
    "two_kinds_of_tensor": Case(two_kinds_of_tensor, RecordingError, "is_input and is_target", "at most one"),
    "not_a_tensor": Case(not_a_tensor, RecordingError, "'numbers'", "torch.Tensor"),
    "star_in_tensor_name": Case(star_in_tensor_name, RecordingError, "'memory*old'", "without '*'"),
    "non_increasing_training_step": Case(non_increasing_training_step, RecordingError, "training_step=5",
                                         "grows"),
    "decreasing_training_step": Case(decreasing_training_step, RecordingError, "training_step=3", "grows"),
    "bad_type_of_execution": Case(bad_type_of_execution, ConfigError, "'05 iterations'", "letters, digits"),
    "reserved_type_of_execution": Case(reserved_type_of_execution, ConfigError, "'any_value'", "not 'any_value'"),
    "dunder_type_of_execution": Case(dunder_type_of_execution, ConfigError, "'__internal'", "not starting with"),
    "non_string_type_of_execution": Case(non_string_type_of_execution, ConfigError, "type_of_execution=5",
                                         "letters"),
    "gradient_group_named_forward": Case(gradient_group_named_forward, RecordingError, "'forward'", "'gradients'"),
    "unknown_connection_source": Case(unknown_connection_source, RecordingError, "'hidden_stat'",
                                      "did you mean 'hidden_state'"),
    "finish_dynamic_batch_without_decision": Case(finish_dynamic_batch_without_decision, RecordingError,
                                                  "type_of_execution=None", "decide_recording_of_batch"),
    "wrong_number_of_categories": Case(wrong_number_of_categories, RecordingError, "3 entries",
                                       "one category per sample"),
    "kpi_tensor_with_many_values": Case(kpi_tensor_with_many_values, RecordingError, "(4,)", "one-element tensor"),
    "kpi_that_is_not_a_number": Case(kpi_that_is_not_a_number, RecordingError, "'0.5'", "a number"),
    "track_module_inside_a_step": Case(track_module_inside_a_step, RecordingError, "'late'", "before the first"),
    "track_module_name_with_dot": Case(track_module_name_with_dot, RecordingError, "'main.model'", "no '.'"),
    "track_module_name_twice": Case(track_module_name_twice, RecordingError, "'model'", "another module_name"),
    "name_of_untracked_module": Case(name_of_untracked_module, RecordingError, "Linear", "track_module"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_raises_a_helpful_comgra_error(case: Case, make_recorder) -> None:
    recorder = make_recorder(policy=DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1))
    with pytest.raises(case.error) as raised:
        case.action(recorder)
    message = str(raised.value)
    assert isinstance(raised.value, ComgraError)
    assert case.names in message, message
    assert case.fix in message, message


CONFIG_CASES = {
    "policy_is_not_a_policy": ({"decision_maker_for_recordings": {0, 10}}, "{0, 10}", "DecisionMakerFor"),
    "trial_id_with_slash": ({"trial_id": "a/b"}, "trial_id='a/b'", "folder name"),
    "empty_group": ({"group": ""}, "group=''", "non-empty"),
    "negative_batch_size_to_record": ({"max_num_batch_size_to_record": -1}, "max_num_batch_size_to_record=-1",
                                      "None (all samples)"),
    "negative_neurons": ({"max_num_neurons_to_record": -5}, "max_num_neurons_to_record=-5", "e.g. 256"),
    "visual_prefixes_in_the_wrong_order": ({"prefixes_for_grouping_module_parameters_visually": ["m", "m.a"]},
                                           "'m.a'", "more specific prefixes first"),
}


@pytest.mark.parametrize(("kwargs", "names", "fix"), CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_bad_constructor_arguments_raise_config_error(kwargs, names, fix, store_root) -> None:
    arguments = {"comgra_root_path": store_root, "group": "group", "trial_id": "trial",
                     "decision_maker_for_recordings": DecisionMakerForRecordingsFrequencyPerType(1)}
    arguments.update(kwargs)
    with pytest.raises(ConfigError) as raised:
        ComgraRecorder(**arguments)
    assert names in str(raised.value) and fix in str(raised.value), str(raised.value)
    assert not (store_root / "group").exists()


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"min_training_steps_difference": -1}, "min_training_steps_difference=-1"),
    ({"min_training_steps_difference": 1, "exponential_backoff_factor": 0.5}, "exponential_backoff_factor=0.5"),
])
def test_bad_policy_arguments_raise_config_error(kwargs, names) -> None:
    with pytest.raises(ConfigError, match=re.escape(names)):
        DecisionMakerForRecordingsFrequencyPerType(**kwargs)


def test_parameter_not_covered_by_visual_prefixes_raises(make_recorder) -> None:
    recorder = make_recorder(prefixes_for_grouping_module_parameters_visually=["main.encoder"])
    with pytest.raises(ConfigError, match=r"'main\.decoder\.weight'.*add one"):
        recorder.track_module("main", torch.nn.ModuleDict({"encoder": torch.nn.Linear(2, 2),
                                                           "decoder": torch.nn.Linear(2, 2)}))


def test_errors_are_raised_on_non_recorded_steps_for_call_order(make_recorder) -> None:
    """The call order is checked on every step, recorded or not, so mistakes show up at once."""
    recorder = make_recorder(set())
    recorder.start_batch(0, B)
    assert not recorder.recording_is_active()
    with pytest.raises(RecordingError, match="start_iteration"):
        recorder.register_tensor("x", _x())


def test_warning_turned_into_an_error_by_the_user_propagates_unchanged(make_recorder) -> None:
    """With warnings as errors the user gets comgra's warning itself, not an 'internal error' report."""
    recorder = make_recorder({0})
    recorder.start_batch(0, B)
    recorder.start_iteration()
    recorder.register_tensor("lonely", _x())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ComgraWarning)
        with pytest.raises(ComgraWarning, match="'lonely' has no connection"):
            recorder.finish_iteration()
    assert not recorder.session.broken
