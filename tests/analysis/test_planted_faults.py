"""Each planted fault is found at the node and step where it was planted; a healthy network stays quiet."""
from __future__ import annotations

import math

import pytest
from scipy import stats as scipy_stats

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from planted import InfiniteGradient, Network, mlp, record  # noqa: E402

from comgra.analysis import Finding, ScanOptions, Scanner  # noqa: E402
from comgra.store import GroupReader  # noqa: E402

LOUD = ("error", "warning")


def scan(group, **options) -> list[Finding]:
    return Scanner().scan(group, options=ScanOptions(**options)).findings


def of(findings: list[Finding], detector: str) -> list[Finding]:
    return [f for f in findings if f.detector == detector]


def test_healthy_network_has_no_finding_of_warning_or_above(tmp_path) -> None:
    group = record(tmp_path, "healthy", Network(mlp(4, 16, 16, 1), steps=40, lr=0.02))
    loud = [f"{f.detector} {f.node}: {f.message}" for f in scan(group) if f.severity in LOUD]
    assert loud == []


def test_nan_injected_at_a_layer_is_found_at_that_node_and_step_with_its_spread(tmp_path) -> None:
    def nan_in_layer1_at_step_12(step, name, h):
        if step == 12 and name == "layer1":
            h = h.clone()
            h[3, 0] = float("nan")
        return h

    group = record(tmp_path, "nan", Network(mlp(4, 8, 8, 8, 1), steps=20, inject=nan_in_layer1_at_step_12))
    found = scan(group)
    forward = [f for f in of(found, "non_finite") if f.kind == "forward" and f.origin]
    assert len(forward) == 1, [f.message for f in of(found, "non_finite")]
    origin = forward[0]
    assert (origin.node, origin.training_step, origin.severity) == ("layer1", 12, "error")
    # What the store says: layer1 holds a NaN at step 12 and its input layer0 does not.
    trial = GroupReader(group).trial("nan")
    nan_rows = trial.selection(training_step=12, node="layer1", kind="forward", aggregation="mean").to_pylist()
    assert nan_rows[0]["nan_count"] > 0
    assert trial.selection(training_step=12, node="layer0", kind="forward", aggregation="mean"
                           ).to_pylist()[0]["nan_count"] == 0
    assert trial.selection(training_step=11, node="layer1", kind="forward", aggregation="mean"
                           ).to_pylist()[0]["nan_count"] == 0
    spread = [s.split("@")[0] for s in origin.evidence["spread_to"]]
    assert spread[:2] == ["layer2", "layer3"] and "layer0" not in spread
    assert found[0] is origin  # the origin ranks first, above the nodes it spread to
    spread_findings = [f for f in of(found, "non_finite") if f.kind == "forward" and not f.origin]
    assert {f.node for f in spread_findings} >= {"layer2", "layer3"}
    assert origin.selection == {"trial": "nan", "training_step": 12, "iteration": 0, "node_id": "layer1",
                                "role": "layer1", "kind": "forward", "aggregation": "mean"}


def test_infinite_gradient_of_the_backward_pass_only_has_its_origin_on_the_gradient_side(tmp_path) -> None:
    def infinite_gradient_after_layer1_at_step_9(step, name, h):
        return InfiniteGradient.apply(h) if step == 9 and name == "layer1" else h

    group = record(tmp_path, "inf", Network(mlp(4, 8, 8, 8, 1), steps=12, lr=0.0,
                                            after=infinite_gradient_after_layer1_at_step_9))
    found = of(scan(group), "non_finite")
    gradient = [f for f in found if f.kind == "gradients" and f.origin]
    assert [(f.node, f.training_step, f.severity) for f in gradient] == [("layer1", 9, "error")]
    # SGD turns the infinite gradient into NaN weights (0 * inf), so the forward pass breaks one step later,
    # and its origin is a parameter, not the gradient's node.
    forward = [f for f in found if f.kind == "forward" and f.origin]
    assert [(f.training_step, f.node.startswith("model")) for f in forward] == [(10, True)]
    assert "layer1" not in gradient[0].evidence["spread_to"]
    spread = {s.split("@")[0] for s in gradient[0].evidence["spread_to"]}
    assert "layer2" not in spread and "input" in spread and "layer0" in spread
    trial = GroupReader(group).trial("inf")
    assert trial.selection(training_step=9, node="layer1", kind="gradients", aggregation="mean"
                           ).to_pylist()[0]["inf_count"] > 0
    assert trial.selection(training_step=9, node="layer2", kind="gradients", aggregation="mean"
                           ).to_pylist()[0]["inf_count"] == 0


def test_deep_sigmoid_stack_has_vanishing_gradients_at_its_first_layers(tmp_path) -> None:
    blocks = mlp(16, *[16] * 12, 1, activation=nn.Sigmoid)
    group = record(tmp_path, "deep", Network(blocks, inputs=16, steps=10, lr=0.01))
    vanishing = [f for f in of(scan(group), "vanishing_gradient")]
    # One finding per cause: the layers whose gradients vanish are listed in one summary finding (its members).
    listed = {(m["node"], m["role"]): f for f in vanishing for m in f.evidence.get("members", [])}
    listed.update({(f.node, f.role): f for f in vanishing if not f.evidence.get("members")})
    nodes = {node for node, role in listed if node == role}
    assert {"layer0", "layer1"} <= nodes, [f.message for f in vanishing]
    assert "layer11" not in nodes and "layer12" not in nodes  # next to the loss the gradient is healthy
    first = listed[("layer0", "layer0")]
    assert first.severity == "warning" and first.evidence["orders_of_magnitude"] > 4
    trial = GroupReader(group).trial("deep")
    magnitude = {node: trial.selection(training_step=0, node=node, kind="gradients", aggregation="abs_max"
                                       ).to_pylist()[0]["abs_mean"] for node in ("layer0", "layer12")}
    assert math.log10(magnitude["layer12"] / magnitude["layer0"]) > 4


def test_relu_with_a_large_negative_bias_has_dead_units(tmp_path) -> None:
    blocks = mlp(4, 16, 1, activation=nn.ReLU)
    with torch.no_grad():
        blocks[0][1][0].bias.fill_(-20.0)
    group = record(tmp_path, "dead", Network(blocks, steps=10))
    dead = of(scan(group), "dead_units")
    assert [(f.node, f.severity) for f in dead] == [("layer0", "warning")]
    assert dead[0].evidence["dead_fraction"] == 1.0
    trial = GroupReader(group).trial("dead")
    assert max(trial.selection(training_step=5, node="layer0", aggregation="abs_max").to_pylist()[0]["neurons"]) == 0


def test_one_sided_output_is_a_warning_at_the_layer_before_the_output(tmp_path) -> None:
    blocks = mlp(4, 16, 3, last=nn.LeakyReLU(0.01))
    group = record(tmp_path, "one_sided", Network(blocks, steps=10, output=torch.sigmoid,
                                                  target=lambda x: (x[:, :3] > 0).float()))
    found = of(scan(group), "one_sided")
    warnings = [f for f in found if f.severity == "warning"]
    assert [f.node for f in warnings] == ["layer1"]
    assert 0 < warnings[0].evidence["ratio"] < 0.05
    assert "layer0" not in {f.node for f in found}  # tanh: both signs


def test_an_output_one_sided_early_in_training_only_is_found_on_those_steps(tmp_path) -> None:
    """A network can learn to push values through a wrongly placed activation with ever larger inputs (the
    tutorial's leaky ReLU reaches -32 late in a long run): the extremes of the whole run are then balanced,
    and only the steps show the fault."""
    def later_both_sides(step, name, h):
        return h * 100 - 50 if name == "layer1" and step >= 6 else h

    blocks = mlp(4, 16, 3, last=nn.LeakyReLU(0.01))
    group = record(tmp_path, "one_sided_early", Network(blocks, steps=12, output=torch.sigmoid,
                                                        target=lambda x: (x[:, :3] > 0).float(),
                                                        inject=later_both_sides))
    warnings = [f for f in of(scan(group), "one_sided") if f.severity == "warning"]
    assert [f.node for f in warnings] == ["layer1"]
    assert (warnings[0].evidence["one_sided_steps"], warnings[0].evidence["recorded_steps"]) == (6, 12)
    assert warnings[0].steps == list(range(6)) and warnings[0].training_step == 0
    assert "on 6 of 12 recorded steps (training steps 0 to 5)" in warnings[0].message


def test_a_target_high_when_any_unit_is_near_zero_is_linked_to_the_smallest_unit(tmp_path) -> None:
    """The tutorial's loss per sample averages over its outputs, and it is high when any partial sum is near
    zero: no single unit shows that as clearly as the unit closest to zero."""
    noise = torch.Generator().manual_seed(3)

    def register_difficulty(recorder, x):
        difficulty = torch.exp(-4 * x.abs()).mean(dim=1, keepdim=True)
        recorder.register_tensor("difficulty", difficulty + 0.02 * torch.randn(x.shape[0], 1, generator=noise))

    group = record(tmp_path, "nearest", Network(mlp(4, 8, 1), steps=20, extra=register_difficulty))
    top = of(scan(group, target="difficulty"), "correlation")[0]
    assert (top.node, top.evidence["feature"]) == ("input", "the smallest |input[i]|")
    assert top.evidence["spearman"] < -0.6
    assert top.message.startswith("difficulty is high when the smallest |input[i]| is small (Spearman")


def test_layer_left_out_of_the_optimizer_gets_a_gradient_but_never_changes(tmp_path) -> None:
    network = Network(mlp(4, 8, 1), steps=8, optimized=lambda model: model[1].parameters())
    found = scan(record(tmp_path, "forgotten", network))
    not_updated = of(found, "parameter_not_updated")
    assert sorted(f.role for f in not_updated) == ["model.0.0.bias", "model.0.0.weight"]
    assert all(f.severity == "warning" for f in not_updated)
    assert not [f for f in found if f.detector.startswith("parameter") and "model.1" in (f.role or "")]


def test_frozen_layer_is_reported_as_information_only(tmp_path) -> None:
    blocks = mlp(4, 8, 1)
    for parameter in blocks[0][1].parameters():
        parameter.requires_grad_(False)
    network = Network(blocks, steps=8, optimized=lambda model: model[1].parameters())
    frozen = of(scan(record(tmp_path, "frozen", network)), "parameter_frozen")
    assert sorted((f.role, f.severity) for f in frozen) == [("model.0.0.bias", "info"), ("model.0.0.weight", "info")]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_per_sample_target_driven_by_one_input_feature_is_found_with_its_sign(tmp_path, sign) -> None:
    noise = torch.Generator().manual_seed(7)

    def register_difficulty(recorder, x):
        difficulty = sign * x[:, 2:3] + 0.3 * torch.randn(x.shape[0], 1, generator=noise)
        recorder.register_tensor("difficulty", difficulty)

    group = record(tmp_path, "hint", Network(mlp(4, 8, 1), steps=20, extra=register_difficulty))
    hints = of(scan(group, target="difficulty"), "correlation")
    top = hints[0]
    assert (top.node, top.evidence["feature"]) == ("input", "input[2]")
    assert math.copysign(1, top.evidence["spearman"]) == sign and abs(top.evidence["spearman"]) > 0.8
    assert top.evidence["samples"] == 20 * 8 and top.evidence["q_value"] < 1e-6
    direction = "high" if sign > 0 else "small"
    assert top.message.startswith(f"difficulty is high when input[2] is {direction} (Spearman")


def test_a_target_and_a_feature_that_only_drift_with_the_step_give_no_hint(tmp_path) -> None:
    """Both move with training (as a loss and an activation do) but, within a step, are independent noise:
    pooling the samples of every step would show a strong link that is only training progress."""
    noise = torch.Generator().manual_seed(11)
    step = iter(range(10**6))

    def register_drifting_pair(recorder, x):
        drift = 0.0 * x[:, :1] - 0.5 * next(step)  # from the input, so that the graph connects them
        recorder.register_tensor("difficulty", drift + torch.randn(x.shape[0], 1, generator=noise))
        recorder.register_tensor("drifting", drift + torch.randn(x.shape[0], 3, generator=noise))

    group = record(tmp_path, "drift", Network(mlp(4, 8, 1), steps=20, extra=register_drifting_pair))
    hints = of(scan(group, target="difficulty"), "correlation")
    assert [f.message for f in hints] == []
    # The drift is there to be mistaken: pooled over steps, the two are almost perfectly ranked together.
    trial = GroupReader(group).trial("drift")
    pooled = [[row["mean"] for step in range(20) for row in sorted(
        trial.selection(training_step=step, node=node, kind="forward", aggregation="sample").to_pylist(),
        key=lambda row: row["sample"])] for node in ("difficulty", "drifting")]
    assert len(pooled[0]) == len(pooled[1]) == 20 * 8
    assert scipy_stats.spearmanr(*pooled).statistic > 0.9


def test_unknown_target_names_the_per_sample_tensors(tmp_path) -> None:
    from comgra.errors import SelectionError

    group = record(tmp_path, "t", Network(mlp(4, 8, 1), steps=4))
    with pytest.raises(SelectionError, match="difficulty.*Known: .*loss_per_sample"):
        scan(group, target="difficulty")


def test_two_roles_holding_the_same_values_give_one_hint_that_names_both(tmp_path) -> None:
    """As the tutorial's helper_partial_sums at its last iteration (roles final_sums and partial_sums): one
    link, found once. A role whose values differ (doubled: the same ranks, so the same Spearman) stays apart."""
    noise = torch.Generator().manual_seed(5)

    def register_copies(recorder, x):
        recorder.register_tensor("difficulty", x[:, 2:3] + 0.3 * torch.randn(x.shape[0], 1, generator=noise))
        for role, values in (("first", x[:, 1:3]), ("second", x[:, 1:3]), ("doubled", 2 * x[:, 1:3])):
            recorder.register_tensor(f"copy__{role}", values.clone(), node_name="copy", role_within_node=role)

    group = record(tmp_path, "copies", Network(mlp(4, 8, 1), steps=20, extra=register_copies))
    hints = [f for f in of(scan(group, target="difficulty"), "correlation") if f.node == "copy"]
    assert sorted(f.role for f in hints) == ["doubled", "first"], [f.message for f in hints]
    merged = next(f for f in hints if f.role == "first")
    doubled = next(f for f in hints if f.role == "doubled")
    assert merged.evidence["roles"] == ["first", "second"] and doubled.evidence["roles"] == ["doubled"]
    assert "copy holds the same values under its roles first and second" in merged.message
    assert "second" not in doubled.message
    # The evidence is the same link: the same feature and numbers as the role that differs only in scale.
    assert merged.evidence["feature"] == doubled.evidence["feature"] == "copy[1]"
    assert merged.evidence["spearman"] == doubled.evidence["spearman"] > 0.8
    assert merged.selection["role"] == "first"
