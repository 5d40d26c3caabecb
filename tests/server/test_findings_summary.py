"""A summary finding (one cause over many tensors, ``comgra.analysis.findings.summarised``) in the Findings tab:
its tensors in a fold under the message, not repeated in the evidence text."""
from __future__ import annotations

from comgra.analysis.findings import Finding, rank_findings, summarised
from comgra.server import findings as view


def _frozen(node: str) -> Finding:
    return Finding(detector="parameter_frozen", severity="info", score=0.5, trial="t", node=node, role=node,
                   kind="forward", training_step=0, message=f"{node} never changes over steps 0 to 9 and gets no "
                   "gradient: frozen.", steps=[0, 9], evidence={"steps": 2})


def _texts(component) -> list[str]:
    found = []
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if isinstance(child, str):
            found.append(child)
        elif child is not None:
            found.extend(_texts(child))
    return found


def test_a_frozen_base_is_one_item_whose_tensors_fold_out() -> None:
    nodes = [f"model.base.layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")]
    other = Finding(detector="dead_units", severity="warning", score=0.9, trial="t", node="model.head", role="model.head",
                    kind="forward", training_step=0, message="dead", evidence={"dead_fraction": 1.0})
    found = rank_findings(summarised(rank_findings([_frozen(n) for n in nodes] + [other])))
    assert [f.detector for f in found] == ["dead_units", "parameter_frozen"]
    summary = found[1]
    assert summary.evidence["count"] == 6 and summary.evidence["module"] == "model.base.layers"
    assert [m["node"] for m in summary.evidence["members"]] == sorted(nodes)
    assert summary.message.startswith("6 tensors of model.base.layers (")
    item = view.findings_list(found)
    texts = _texts(item)
    assert "6 tensors" in texts and all(any(t.startswith(n) for t in texts) for n in nodes)
    assert "members" not in view._evidence_text(summary)  # listed in the fold, not in the evidence text
    assert len(summarised([_frozen(n) for n in nodes[:2]])) == 2  # two alike are not yet a summary
