"""Write a synthetic recording shaped like the tutorial's, without torch.

The recording goes through the real writer (``ChunkWriter``) and the real
metadata format, so the app and the benchmarks read exactly what a training
run would leave on disk. At ``--scale 1`` it resembles the tutorial: two
trials, 15 nodes including three parameter groups, up to 20 iterations per
step, 5 recorded samples and 240 recorded steps per trial. ``--scale 50``
records 50 times as many steps (a longer run), and KPIs on every training step.

``--nodes N`` (N > 15) gives a transformer-shaped network instead: an
embedding, blocks of attention + MLP (14 tensors and 16 parameters each, every
parameter its own node as the recorder makes them by default) and a head, about
N nodes in all, one iteration per step.

Every step is written as a recorder writes it: the same ``ChunkWriter`` (so the same sorting, row
groups, compression and tiered merging of chunks), the same metadata, graphs and steps index, and a
flush every ``--steps-per-chunk`` recorded steps. The values are normal draws around a drift; with
``--distinct-steps K`` only the first K steps draw their own and every later step repeats step
``index % K``'s values under its own training step (a cheap deterministic pattern: the files have the
shape, rows and chunk layout of a real run of that length; only the numbers repeat, so they compress
somewhat better than a real run's would). A repeated step shuffles its recorded samples, tensor by tensor
(``shuffled_samples``): a real run's steps see new samples, and steps that paired every tensor's samples
the same way would link any two tensors sample by sample, so a scan would find correlation hints at
+-1.00 that come from the copying. ``--jobs 2`` writes the trials in two processes (the same
files as one process writes). ``--progress`` prints how far each trial is.

Where the time goes (profiled with cProfile, 40 nodes): with ``--distinct-steps 8`` building the rows is
under 5 %; the writer's work (sorting each chunk, Parquet encoding with zstd, and the merges that read
16 chunks back and write them as one) is the rest. Those are the writer's own costs, which a
recording made by a real run pays the same way, so this script does not avoid them. Measured here
(2 cores shared with other jobs, load 7-14), ``--jobs 2 --distinct-steps 8 --scale 50``: 40 nodes in
5.5 min (78 MiB), 200 nodes in about 27 min.

At 1,000 nodes (cProfile, one trial at ``--scale 1 --distinct-steps 8``, 80 s, load 8): building the 8
distinct steps took 33 s (4 s a step: numpy statistics over a thousand small arrays, paid once per trial),
and the writer 40 s for 10 chunks, 4 s each: the sort of a 25-step chunk (213,500 rows) 1.5 s and its zstd
Parquet encoding (9.9 MB) 3.3 s. Such a chunk is above the writer's merge limit (``max_merged_rows``), so
nothing is merged and the chunks are the same 25-step chunks at every scale, only more of them: 50x is
480 chunks a trial and 9.5 GB. Such chunks, made only of repeated steps, now skip both sorts
(``PresortedChunks``: one sorted table per offset into the repeated steps, written with the writer's own
settings under the name its next flush takes; byte for byte the writer's files, which a test checks), so
a chunk costs its Parquet encoding alone (0.4-0.6 s on a quiet core). One trial at ``--scale 1``: 69 s
before, 39 s after (most of it the 8 distinct steps), identical tensors files. 1,000 nodes at 50x
(``--jobs 2``, nice 19, load 9-19): 30 min wall, 8.8 min of CPU for both trials, 6.6 GB.

    python benchmarks/synthetic_recording.py /tmp/comgra-synthetic --scale 1
    python benchmarks/synthetic_recording.py /tmp/comgra-transformer --nodes 200
    python benchmarks/synthetic_recording.py /tmp/comgra-long --nodes 40 --scale 50 --distinct-steps 8 --jobs 2 --progress
    comgra --path /tmp/comgra-synthetic/synthetic
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing
import shutil
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comgra.store import format as fmt
from comgra.store import layout
from comgra.store import writer as store_writer
from comgra.store.writer import ChunkWriter

TYPES = {"01_iterations": 1, "03_iterations": 3, "05_iterations": 5, "10_iterations": 10, "20_iterations": 20}
TYPE_WEIGHTS = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
SAMPLES = 5
BATCH = 8
NEURON_LIMIT = 64
GRADIENTS = "gradients"


@dataclass(frozen=True)
class NodeSpec:
    """One node of the synthetic network; ``present`` says in which iterations it exists."""

    node: str
    role: str  # input, target, loss, output, parameter, intermediate, initial_value
    roles: tuple[str, ...]
    width: int
    present: str = "all"  # all, first, later, last, once (parameters and initial values)
    has_batch: bool = True
    gradient: bool = True
    frozen: tuple[str, ...] = ()
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


HIDDEN = 16
SPECS = [
    NodeSpec("input", "input", ("input",), 5, gradient=False),
    NodeSpec("target", "target", ("target",), 5, present="last", gradient=False),
    NodeSpec("initial_hidden_state", "initial_value", ("initial_hidden_state",), HIDDEN, present="once"),
    NodeSpec("helper_partial_sums", "intermediate", ("partial_sums", "running_max"), 5, gradient=False),
    NodeSpec("subnet_pre__out", "intermediate", ("subnet_pre__out",), HIDDEN),
    NodeSpec("subnet_mem__out", "intermediate", ("subnet_mem__out",), HIDDEN),
    NodeSpec("subnet_out__out", "intermediate", ("subnet_out__out",), 5),
    NodeSpec("output", "output", ("output",), 5),
    NodeSpec("loss_per_sample", "loss", ("loss_per_sample",), 1, present="last"),
    NodeSpec("loss", "loss", ("loss",), 1, present="last", has_batch=False),
    NodeSpec("subnet_pre", "parameter", ("weight0", "bias0", "weight1", "bias1"), 0, present="once",
             has_batch=False, frozen=("bias1",),
             param_shapes={"weight0": (HIDDEN, 5), "bias0": (HIDDEN,), "weight1": (HIDDEN, HIDDEN), "bias1": (HIDDEN,)}),
    NodeSpec("subnet_mem", "parameter", ("weight", "bias"), 0, present="once", has_batch=False,
             param_shapes={"weight": (HIDDEN, 2 * HIDDEN), "bias": (HIDDEN,)}),
    NodeSpec("subnet_out", "parameter", ("weight", "bias"), 0, present="once", has_batch=False,
             param_shapes={"weight": (5, HIDDEN), "bias": (5,)}),
]
SPEC_BY_NODE = {spec.node: spec for spec in SPECS}
TUTORIAL_MODULES = ("subnet_pre", "subnet_mem", "subnet_out")
# (source id, source role, target id, target role); "subnet_mem__out*old" is the previous iteration's state.
EDGES = [
    ("input", "input", "subnet_pre__out", "subnet_pre__out"),
    ("input", "input", "helper_partial_sums", "partial_sums"),
    *[("subnet_pre", r, "subnet_pre__out", "subnet_pre__out") for r in ("weight0", "bias0", "weight1", "bias1")],
    ("subnet_pre__out", "subnet_pre__out", "subnet_mem__out", "subnet_mem__out"),
    ("initial_hidden_state", "initial_hidden_state", "subnet_mem__out", "subnet_mem__out"),
    ("subnet_mem__out*old", "subnet_mem__out", "subnet_mem__out", "subnet_mem__out"),
    *[("subnet_mem", r, "subnet_mem__out", "subnet_mem__out") for r in ("weight", "bias")],
    ("subnet_mem__out", "subnet_mem__out", "subnet_out__out", "subnet_out__out"),
    *[("subnet_out", r, "subnet_out__out", "subnet_out__out") for r in ("weight", "bias")],
    ("subnet_out__out", "subnet_out__out", "output", "output"),
    ("output", "output", "loss_per_sample", "loss_per_sample"),
    ("target", "target", "loss_per_sample", "loss_per_sample"),
    ("loss_per_sample", "loss_per_sample", "loss", "loss"),
]




@dataclass(frozen=True)
class Network:
    """What a synthetic trial records: its nodes, their edges, the types of step and the module tree."""

    specs: tuple[NodeSpec, ...]
    edges: tuple[tuple[str, str, str, str], ...]
    types: dict[str, int]
    type_weights: tuple[float, ...]
    recurrent: bool  # the tutorial's memory: "subnet_mem__out*old" feeds the next iteration
    modules: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (parameter full name, shape), for the module tree

    def spec(self, node_id: str) -> NodeSpec:
        return self.by_node[node_id.removesuffix("*old")]

    @property
    def by_node(self) -> dict[str, NodeSpec]:
        cached = self.__dict__.get("_by_node")
        if cached is None:
            cached = {spec.node: spec for spec in self.specs}
            object.__setattr__(self, "_by_node", cached)
        return cached


TUTORIAL = Network(tuple(SPECS), tuple(EDGES), TYPES, tuple(TYPE_WEIGHTS.tolist()), recurrent=True)
BLOCK_NODES = 30  # tensors and parameters of one transformer block
OUTER_NODES = 12  # input, embedding, final norm, head, target and losses


def transformer(nodes: int) -> Network:
    """A transformer-shaped network of about ``nodes`` nodes (at least one block)."""
    layers = max(1, round((nodes - OUTER_NODES) / BLOCK_NODES))
    specs: list[NodeSpec] = []
    edges: list[tuple[str, str, str, str]] = []
    parameters: list[tuple[str, tuple[int, ...]]] = []

    def tensor(name: str, role: str = "intermediate", width: int = HIDDEN, **options: object) -> str:
        specs.append(NodeSpec(name, role, (name,), width, **options))
        return name

    def parameter(full_name: str, shape: tuple[int, ...]) -> str:
        specs.append(NodeSpec(full_name, "parameter", (full_name,), 0, present="once", has_batch=False,
                              param_shapes={full_name: shape}))
        parameters.append((full_name, shape))
        return full_name

    def link(source: str, target: str) -> None:
        edges.append((source, source, target, target))

    def layer(name: str, module: str, source: str, *, bias: bool = True, shape: tuple[int, ...] = (HIDDEN, HIDDEN)) -> str:
        out = tensor(name)
        link(source, out)
        link(parameter(f"{module}.weight", shape), out)
        if bias:
            link(parameter(f"{module}.bias", shape[:1]), out)
        return out

    tokens = tensor("input", "input", gradient=False)
    x = tensor("embedding")
    link(tokens, x)
    link(parameter("model.tok_emb.weight", (64, HIDDEN)), x)
    link(parameter("model.pos_emb.weight", (32, HIDDEN)), x)
    for i in range(layers):
        module, name = f"model.blocks.{i}", f"block{i}"
        normed = layer(f"{name}.ln1", f"{module}.ln1", x, shape=(HIDDEN,))
        q, k, v = (layer(f"{name}.{p}", f"{module}.attn.{p}_proj", normed) for p in "qkv")
        scores = tensor(f"{name}.scores")
        link(q, scores), link(k, scores)
        probs = tensor(f"{name}.attention")
        link(scores, probs)
        mixed = tensor(f"{name}.mixed")
        link(probs, mixed), link(v, mixed)
        projected = layer(f"{name}.attn_out", f"{module}.attn.out_proj", mixed)
        residual = tensor(f"{name}.residual1")
        link(x, residual), link(projected, residual)
        normed = layer(f"{name}.ln2", f"{module}.ln2", residual, shape=(HIDDEN,))
        hidden = layer(f"{name}.fc1", f"{module}.mlp.fc1", normed)
        active = tensor(f"{name}.gelu")
        link(hidden, active)
        out = layer(f"{name}.fc2", f"{module}.mlp.fc2", active)
        x = tensor(f"{name}.residual2")
        link(residual, x), link(out, x)
    normed = layer("ln_f", "model.ln_f", x, shape=(HIDDEN,))
    logits = layer("logits", "model.lm_head", normed, bias=False)
    specs[[s.node for s in specs].index(logits)] = NodeSpec(logits, "output", (logits,), HIDDEN)
    target = tensor("target", "target", gradient=False)
    loss_per_sample = tensor("loss_per_sample", "loss", width=1)
    link(logits, loss_per_sample), link(target, loss_per_sample)
    loss = tensor("loss", "loss", width=1, has_batch=False)
    link(loss_per_sample, loss)
    return Network(tuple(specs), tuple(edges), {"train": 1}, (1.0,), recurrent=False, modules=tuple(parameters))


def network_of(nodes: int) -> Network:
    """The tutorial's network for 15 nodes or fewer, else a transformer of about ``nodes`` nodes."""
    return TUTORIAL if nodes <= 15 else transformer(nodes)


# -- graphs -------------------------------------------------------------------------------------
def graph_for(first: bool, last: bool, net: Network = TUTORIAL) -> dict:
    """The dependency graph of an iteration: which nodes exist depends on its position."""
    ids = [s.node for s in net.specs if _present(s, first, last)]
    if net.recurrent:
        ids.append("initial_hidden_state" if first else "subnet_mem__out*old")
        ids = [i for i in dict.fromkeys(ids) if not (i == "initial_hidden_state" and not first)]
    edges = [e for e in net.edges if e[0] in ids and e[2] in ids]
    columns = _columns(ids, edges, net)
    nodes = [_graph_node(node_id, columns[node_id], net) for node_id in ids]
    rows: dict[int, int] = {}
    for node in sorted(nodes, key=lambda n: (n["role"] == "parameter", ids.index(n["id"]))):
        node["row"] = rows.get(node["column"], 0)
        rows[node["column"]] = node["row"] + 1
    document = {"format_version": fmt.FORMAT_VERSION, "nodes": nodes,
                "edges": [dict(zip(("source", "source_role", "target", "target_role"), e)) for e in edges]}
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]
    return {"format_version": fmt.FORMAT_VERSION, "hash": digest, **document}


def _present(spec: NodeSpec, first: bool, last: bool) -> bool:
    return {"all": True, "once": True, "first": first, "later": not first, "last": last}[spec.present]


def _columns(ids: list[str], edges: list[tuple[str, str, str, str]], net: Network) -> dict[str, int]:
    """Longest path from a source; a parameter sits one column left of its first consumer."""
    columns: dict[str, int] = {}
    sources_of: dict[str, list[str]] = {}
    for e in edges:
        if net.spec(e[0]).role != "parameter":
            sources_of.setdefault(e[2], []).append(e[0])

    def depth(node_id: str) -> int:
        if node_id not in columns:
            columns[node_id] = 1 + max((depth(s) for s in sources_of.get(node_id, ())), default=-1)
        return columns[node_id]

    for node_id in ids:
        if net.spec(node_id).role == "parameter":
            consumers = [depth(e[2]) for e in edges if e[0] == node_id]
            columns[node_id] = max(0, min(consumers, default=1) - 1)
        else:
            depth(node_id)
    return columns


def _graph_node(node_id: str, column: int, net: Network) -> dict:
    spec = net.spec(node_id)
    old = node_id.endswith("*old")
    node = {"id": node_id, "node": spec.node, "role": spec.role, "tensor_type": spec.role,
            "roles": list(spec.roles), "has_batch": spec.has_batch, "iteration_offset": -1 if old else 0,
            "absolute_iteration": -1 if spec.present == "once" else None, "column": column, "row": 0}
    if spec.role == "parameter":  # the tutorial groups by its own prefixes; the recorder's default is ""
        node["group"] = f"main_model.{spec.node}" if net.recurrent else ""
    return node


# -- tensor rows --------------------------------------------------------------------------------
@dataclass
class _Rows:
    """Columns of the tensors table, gathered block by block and turned into one table at the end."""

    columns: dict[str, list[np.ndarray]] = field(default_factory=lambda: {n: [] for n in fmt.TENSORS_SCHEMA.names})
    shape_lengths: list[np.ndarray] = field(default_factory=list)
    neuron_lengths: list[np.ndarray] = field(default_factory=list)

    def add(self, columns: dict[str, object], neurons: np.ndarray) -> None:
        n = neurons.shape[0]
        for name in fmt.TENSORS_SCHEMA.names:
            if name == "neurons":
                self.columns[name].append(neurons.ravel())
                self.neuron_lengths.append(np.full(n, neurons.shape[1], dtype=np.int32))
            elif name == "shape":
                self.columns[name].append(np.tile(np.asarray(columns[name], dtype=np.int32), n))
                self.shape_lengths.append(np.full(n, len(columns[name]), dtype=np.int32))
            else:
                value = columns[name]
                self.columns[name].append(value if isinstance(value, np.ndarray) else np.full(n, value, dtype=object))

    def table(self) -> pa.Table:
        arrays = {}
        for field_ in fmt.TENSORS_SCHEMA:
            values = np.concatenate(self.columns[field_.name])
            if field_.name in ("shape", "neurons"):
                lengths = self.shape_lengths if field_.name == "shape" else self.neuron_lengths
                offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int32)
                arrays[field_.name] = pa.ListArray.from_arrays(
                    pa.array(offsets), pa.array(values, type=field_.type.value_type))
            else:
                arrays[field_.name] = pa.array(values, type=field_.type, from_pandas=True)
        return pa.table(arrays, schema=fmt.TENSORS_SCHEMA)


def _statistics(values: np.ndarray) -> dict[str, np.ndarray]:
    """The statistics over the last axis (the value dimensions)."""
    absolute = np.abs(values)
    return {"mean": values.mean(-1), "abs_mean": absolute.mean(-1), "std": values.std(-1),
            "min": values.min(-1), "max": values.max(-1), "abs_max": absolute.max(-1),
            "nan_count": np.zeros(values.shape[:-1]), "inf_count": np.zeros(values.shape[:-1])}


def batch_rows(rows: _Rows, x: np.ndarray, base: dict[str, object], iterations: np.ndarray,
               categories: list[str] | None) -> None:
    """Rows of a tensor with a batch dimension: x has shape (iterations, batch, width).

    The aggregated rows summarise the per-sample statistics over the batch; the
    sample rows are the first ``SAMPLES`` entries of the batch.
    """
    per_sample = _statistics(x)
    parts = [
        ({s: v.mean(1) for s, v in per_sample.items()}, x.mean(1), "mean", -1),
        ({s: v.std(1) for s, v in per_sample.items()}, x.std(1), "std", -1),
        ({s: np.abs(v).max(1) for s, v in per_sample.items()}, np.abs(x).max(1), "abs_max", -1),
        *[({s: v[:, k] for s, v in per_sample.items()}, x[:, k], "sample", k) for k in range(SAMPLES)],
    ]
    count = len(iterations)
    columns = {**base, **{s: np.concatenate([p[0][s] for p in parts]) for s in per_sample},
               "iteration": np.tile(iterations, len(parts)),
               "aggregation": np.repeat(np.array([p[2] for p in parts], dtype=object), count),
               "sample": np.repeat(np.array([p[3] for p in parts], dtype=np.int32), count),
               "category": np.repeat(np.array([None] * 3 + [categories[k] if categories else None
                                                           for k in range(SAMPLES)], dtype=object), count)}
    rows.add(columns, np.concatenate([p[1] for p in parts]).astype(np.float32))


def plain_rows(rows: _Rows, x: np.ndarray, base: dict[str, object], iterations: np.ndarray) -> None:
    """Rows of a tensor without a batch dimension: x has shape (iterations, numel)."""
    stats = _statistics(x)
    svd = {"svd_max": np.abs(x).sum(-1)} if len(base["shape"]) == 2 else {}
    rows.add({**base, **stats, **svd, "iteration": iterations, "aggregation": "none", "sample": -1,
              "category": None}, x[:, :NEURON_LIMIT].astype(np.float32))


@dataclass
class StepPlan:
    training_step: int
    type_of_execution: str
    progress: float  # 0 at the start of training, 1 at the end
    categories: list[str] | None


def step_tensors(rng: np.random.Generator, plan: StepPlan, net: Network = TUTORIAL) -> pa.Table:
    n = net.types[plan.type_of_execution]
    rows = _Rows()
    for spec in net.specs:
        for kind in ("forward", GRADIENTS) if spec.gradient else ("forward",):
            for role in spec.roles:
                if kind == GRADIENTS and role in spec.frozen:
                    continue
                _spec_rows(rng, rows, spec, role, kind, n, plan)
    return rows.table()


def _spec_rows(rng: np.random.Generator, rows: _Rows, spec: NodeSpec, role: str, kind: str, n: int,
               plan: StepPlan) -> None:
    iterations = {"all": np.arange(n), "once": np.array([-1]), "last": np.array([n - 1])}[spec.present]
    iterations = iterations.astype(np.int32)
    scale = (1.0 + 2.0 * plan.progress) * (0.05 if kind == GRADIENTS else 1.0)
    loc = (zlib.crc32(f"{spec.node}.{role}".encode()) % 7 - 3) * 0.1 + plan.progress
    shape = list(spec.param_shapes.get(role, (BATCH, spec.width) if spec.has_batch else ()))
    numel = int(np.prod(shape[1:] if spec.has_batch else shape, dtype=np.int64))
    base = {"training_step": plan.training_step, "kind": kind, "node": spec.node, "role": role,
            "tensor_name": spec.node if len(spec.roles) == 1 else f"{spec.node}.{role}",
            "tensor_type": spec.role, "shape": shape, "svd_max": None, "num_neurons": numel}
    if spec.has_batch:
        x = rng.normal(loc, scale, (len(iterations), BATCH, spec.width))
        batch_rows(rows, x, base, iterations, plan.categories)
    else:
        plain_rows(rows, rng.normal(loc, scale, (len(iterations), max(1, numel))), base, iterations)


def step_index(plan: StepPlan, graphs: dict[tuple[bool, bool], dict], net: Network = TUTORIAL) -> pa.Table:
    n = net.types[plan.type_of_execution]
    hashes = [graphs[(i == 0, i == n - 1)]["hash"] for i in range(n)]
    return pa.table({
        "training_step": [plan.training_step] * n, "type_of_execution": [plan.type_of_execution] * n,
        "iteration": list(range(n)), "graph": hashes, "batch_size": [BATCH] * n,
        "kinds": [["forward", GRADIENTS]] * n, "samples": [list(range(SAMPLES))] * n,
        "categories": [plan.categories] * n, "wall_time": [time.time()] * n,
    }, schema=fmt.STEPS_SCHEMA)


# -- KPIs, notes, metadata ------------------------------------------------------------------------
def kpi_table(rng: np.random.Generator, total_steps: int, types: np.ndarray, trial_index: int,
              net: Network = TUTORIAL) -> pa.Table:
    """A loss and an accuracy on every training step, with rare outliers that a plot must keep."""
    steps = np.arange(total_steps)
    progress = steps / max(1, total_steps - 1)
    loss = (1.0 + 0.3 * trial_index) * np.exp(-3 * progress) + rng.normal(0, 0.02, total_steps) ** 2
    loss[rng.random(total_steps) < 0.001] *= 10.0
    accuracy = 1.0 - loss / (1.0 + loss)
    names = np.array(list(net.types))[types]
    return pa.table({
        "kpi_group": ["loss"] * total_steps + ["accuracy"] * total_steps,
        "kpi_name": ["loss"] * total_steps + ["accuracy"] * total_steps,
        "type_of_execution": np.concatenate([names, names]).tolist(),
        "timepoint": np.concatenate([steps, steps]), "value": np.concatenate([loss, accuracy]),
    }, schema=fmt.KPIS_SCHEMA)


def trial_metadata(trial_id: str, group: str, config: dict, net: Network = TUTORIAL) -> dict:
    if not net.recurrent:
        return {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id, "group": group,
                "created": time.time(), "comgra_version": "synthetic", "config": config,
                "modules": [_module_tree(net.modules)], "types_of_execution": list(net.types)}

    def module(name: str, full_name: str) -> dict:
        spec = SPEC_BY_NODE[name]
        parameters = [{"name": role, "full_name": f"{full_name}.{role}", "shape": list(shape),
                       "numel": int(np.prod(shape)), "requires_grad": role not in spec.frozen}
                      for role, shape in spec.param_shapes.items()]
        return {"name": name, "full_name": full_name, "parameters": parameters, "submodules": []}

    root = {"name": "main_model", "full_name": "main_model", "parameters": [],
            "submodules": [module(n, f"main_model.{n}") for n in ("subnet_pre", "subnet_mem", "subnet_out")]}
    return {"format_version": fmt.FORMAT_VERSION, "trial_id": trial_id, "group": group,
            "created": time.time(), "comgra_version": "synthetic", "config": config,
            "modules": [root], "types_of_execution": list(TYPES)}


def _module_tree(parameters: tuple[tuple[str, tuple[int, ...]], ...]) -> dict:
    """The nested module tree of dotted parameter names, as the recorder's metadata holds it."""
    root: dict = {"name": "model", "full_name": "model", "parameters": [], "submodules": []}
    for full_name, shape in parameters:
        module = root
        for part in full_name.split(".")[1:-1]:
            child = next((m for m in module["submodules"] if m["name"] == part), None)
            if child is None:
                child = {"name": part, "full_name": f"{module['full_name']}.{part}", "parameters": [], "submodules": []}
                module["submodules"].append(child)
            module = child
        module["parameters"].append({"name": full_name.rsplit(".", 1)[1], "full_name": full_name, "shape": list(shape),
                                     "numel": int(np.prod(shape)), "requires_grad": True})
    return root


# -- the whole recording -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Options:
    scale: float = 1.0
    trials: int = 2
    seed: int = 0
    steps_per_chunk: int = 25
    group: str = "synthetic"
    nodes: int = 15  # 15: the tutorial's network; more: a transformer of about that many nodes
    distinct_steps: int = 10**9  # steps with values of their own; later steps repeat them (same statistics)
    jobs: int = 1  # processes writing trials at once
    progress: bool = False  # a line on stderr about every tenth of a trial
    presorted: bool = True  # full chunks of repeated steps skip the writer's sort (same files, see PresortedChunks)
    max_merged_rows: int = 1_000_000  # the writer's default; smaller in tests


def write_trial(group_dir: Path, trial_id: str, trial_index: int, options: Options) -> int:
    """Write one trial; returns the number of tensor rows."""
    rng = np.random.default_rng(options.seed + trial_index)
    net = network_of(options.nodes)
    recorded = max(2, round(240 * options.scale))
    total = recorded * 10
    types = rng.choice(len(net.types), size=total, p=np.asarray(net.type_weights))
    directory = fmt.trial_dir(group_dir, trial_id)
    fmt.write_json_atomic(directory / fmt.TRIAL_META, trial_metadata(
        trial_id, options.group, {"scale": options.scale, "bug_fixed": bool(trial_index % 2)}, net))
    graphs = {(first, last): graph_for(first, last, net) for first in (True, False) for last in (True, False)}
    for graph in graphs.values():
        fmt.write_json_atomic(directory / "graphs" / f"{graph['hash']}.json", graph)
    # No compaction at close: the recording keeps the chunks of ``steps_per_chunk`` steps a long run's tiers leave.
    writer = ChunkWriter(directory, flush_seconds=3600, max_buffered_rows=10**9, max_buffered_bytes=None,
                         max_merged_rows=options.max_merged_rows, compact_at_close=False)
    rows = 0
    made: list[pa.Table] = []  # the first ``distinct_steps`` steps' tensors, reused for the later steps
    presorted = PresortedChunks(directory, writer, options, made)
    chunk: dict[str, list[pa.Table]] = {"tensors": [], "steps": [], "notes": []}
    started = time.perf_counter()
    for index, training_step in enumerate(range(0, total, 10)):
        categories = ["positive", "negative", "positive", "negative", "zero"] if trial_index % 2 else None
        plan = StepPlan(training_step, list(net.types)[types[training_step]], training_step / total, categories)
        chunk_start = index - index % options.steps_per_chunk
        if presorted.covers(chunk_start, recorded):  # its tensors are written at the chunk's end, in one piece
            rows += made[index % len(made)].num_rows
        else:
            table = _reused(made, index, training_step, options) or step_tensors(rng, plan, net)
            if index < options.distinct_steps:
                made.append(table)
            rows += table.num_rows
            chunk["tensors"].append(table)
        chunk["steps"].append(step_index(plan, graphs, net))
        if index % max(1, recorded // 5) == 0:
            chunk["notes"].append(_note(index, f"{trial_id}: recorded step {training_step} of {total}"))
        if (index + 1) % options.steps_per_chunk == 0 or index + 1 == recorded:
            if presorted.covers(chunk_start, recorded):
                presorted.write(chunk_start)  # before the steps that commit it, as the writer orders them
            # One table per chunk (the same rows the recorder's flush gathers): fewer hand-overs to the writer.
            for name, tables in chunk.items():
                if tables:
                    writer.put_table(name, pa.concat_tables(tables))
                tables.clear()
            if (index + 1) % options.steps_per_chunk == 0:  # the last, partial chunk goes out with the KPIs
                writer.flush()
                if index + 1 == options.steps_per_chunk:
                    check_disk(group_dir, directory, 1, -(-recorded // options.steps_per_chunk), options.trials)
            _progress(options, trial_id, index + 1, recorded, started)
    writer.put_table("kpis", kpi_table(rng, total, types, trial_index, net))
    writer.close()
    if writer.error is not None:
        raise writer.error
    return rows


class PresortedChunks:
    """Full chunks made only of repeated steps, written in the writer's order without the writer's sort.

    Such a chunk holds the rows of steps ``distinct_steps`` apart under new training steps, so chunks
    whose first step lies the same distance past a multiple of ``distinct_steps`` differ only in their
    training steps, by a constant: one sorted table per such offset serves them all. At 1,000 nodes this
    leaves only the Parquet encoding per chunk (of the 4 s a chunk took, 1.5 s were the sort, and Arrow's
    sort of sorted rows still costs 0.3-0.7 s). The file is what ``ChunkWriter`` writes: the same rows with
    its rank column, the same ``fmt.TENSOR_SORT`` order, ``writer.write_flushed_chunk`` with the writer's
    row groups, and the name (sequence number, step range) its next flush takes. Only for chunks the
    writer would never merge (each over ``max_merged_rows / (merge_every - 1)`` rows): the writer does not
    see these chunks, so it must not be a merge that it misses.
    """

    MAX_TEMPLATES = 16  # sorted tables kept; beyond that each chunk is sorted once here

    def __init__(self, directory: Path, writer: ChunkWriter, options: Options, made: list[pa.Table]):
        self.directory, self.writer, self.options, self.made = directory, writer, options, made
        self.templates: dict[int, pa.Table] = {}

    def covers(self, chunk_start: int, recorded: int) -> bool:
        size = self.options.steps_per_chunk
        if not self.options.presorted or chunk_start < self.options.distinct_steps or chunk_start + size > recorded:
            return False
        chunk_rows = sum(self.made[(chunk_start + j) % len(self.made)].num_rows for j in range(size))
        return chunk_rows * (self.writer.merge_every - 1) > self.writer.max_merged_rows

    def write(self, chunk_start: int) -> None:
        template = self._template(chunk_start)
        column = template.schema.get_field_index("training_step")
        # write_trial records every tenth training step: step ``index`` is training step 10 * index
        steps = pc.add(template.column(column), pa.scalar(10 * chunk_start, pa.int64()))
        table = shuffled_samples(template.set_column(column, template.schema.field(column), steps))
        bounds = pc.min_max(steps)
        name = fmt.chunk_name(self._next_seq(), bounds["min"].as_py(), bounds["max"].as_py(), self.writer.rank)
        folder = layout.rank_dir(self.directory, "tensors", self.writer.rank)
        folder.mkdir(parents=True, exist_ok=True)
        store_writer.write_flushed_chunk("tensors", folder / name, layout.to_file("tensors", table))

    def _template(self, chunk_start: int) -> pa.Table:
        """The chunk's rows in the writer's order, with training steps counted from the chunk's first step."""
        offset = chunk_start % len(self.made)
        template = self.templates.get(offset)
        if template is None:
            tables = [self.made[(offset + j) % len(self.made)] for j in range(self.options.steps_per_chunk)]
            relative = np.repeat(np.arange(len(tables), dtype=np.int64) * 10, [t.num_rows for t in tables])
            table = pa.concat_tables(tables)
            column = table.schema.get_field_index("training_step")
            table = table.set_column(column, table.schema.field(column), pa.array(relative, pa.int64()))
            rank = pa.repeat(pa.scalar(self.writer.rank, pa.int32()), table.num_rows)
            table = fmt.with_added_columns("tensors", table).append_column(fmt.RANK_FIELD, rank).cast(fmt.SCHEMAS["tensors"])
            template = table.sort_by(fmt.TENSOR_SORT)
            if len(self.templates) < self.MAX_TEMPLATES:
                self.templates[offset] = template
        return template

    def _next_seq(self) -> int:
        """The sequence number the writer's next flush takes: one past the newest chunk (the writer is
        idle between this script's flushes, and a merged chunk, which outlives its parts, is the newest)."""
        return 1 + max((fmt.seq_of(name) for table in fmt.TABLES for name in fmt.chunk_names(layout.rank_dir(self.directory, table, self.writer.rank))),
                       default=-1)


def _reused(made: list[pa.Table], index: int, training_step: int, options: Options) -> pa.Table | None:
    """A copy of an earlier step's tensors under ``training_step`` (large graphs over many steps write fast)."""
    if index < options.distinct_steps:
        return None
    table = made[index % len(made)]
    column = table.schema.get_field_index("training_step")
    return shuffled_samples(table.set_column(column, table.schema.field(column), pa.array(
        np.full(table.num_rows, training_step), table.schema.field(column).type)))


# -- the samples of a repeated step ----------------------------------------------------------------
ORDERS = np.array(list(itertools.permutations(range(SAMPLES))), dtype=np.int64)  # every order of the samples
SAMPLE_GROUP = ("node", "role", "kind", "iteration", "training_step")  # one tensor's samples in one step


def shuffled_samples(table: pa.Table) -> pa.Table:
    """``table`` with the recorded samples of each tensor in each step in an order of their own: the values of
    the ``sample`` rows move between the samples of their tensor, step and iteration; the keys (``sample``,
    its category) stay. The aggregated rows, over the whole batch, do not change.

    The order depends only on the tensor and the training step (a hash), not on where its rows are: the
    writer's sort of shuffled steps and the shuffle of a presorted chunk give the same file."""
    is_sample = pc.equal(table.column("aggregation"), "sample").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(is_sample)
    if not len(rows):
        return table
    group = table.select(list(SAMPLE_GROUP)).take(pa.array(rows))
    exact, stable = zip(*(_codes(group.column(name)) for name in SAMPLE_GROUP))
    sample = table.column("sample").take(pa.array(rows)).to_numpy()
    by_group = rows[np.lexsort([sample, *reversed(exact)])].reshape(-1, SAMPLES)
    first = np.searchsorted(rows, by_group[:, 0])
    if not (table.column("sample").take(pa.array(by_group.ravel())).to_numpy().reshape(-1, SAMPLES)
            == np.arange(SAMPLES)).all():
        raise ValueError(f"every tensor must record samples 0..{SAMPLES - 1} in each step and iteration")
    choice = _mixed(list(stable), first) % len(ORDERS)
    source = np.arange(table.num_rows)
    source[by_group.ravel()] = np.take_along_axis(by_group, ORDERS[choice], axis=1).ravel()
    kept = {*SAMPLE_GROUP, "sample", "category", "aggregation", "tensor_name", "tensor_type", "shape", "num_neurons"}
    moved = pa.array(source)
    for name in table.column_names:
        if name not in kept and name != fmt.RANK_FIELD.name:
            index = table.schema.get_field_index(name)
            table = table.set_column(index, table.schema.field(index), table.column(name).take(moved))
    return table


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Two numbers per value: one equal exactly where the values are (to group by), and one that does not
    depend on the other rows (to hash; strings: their CRC-32)."""
    if pa.types.is_integer(column.type):
        values = column.to_numpy()
        return values, values.astype(np.uint64)
    encoded = pc.dictionary_encode(column).combine_chunks()
    crc = np.array([zlib.crc32(str(v).encode()) for v in encoded.dictionary.to_pylist()], dtype=np.uint64)
    indices = encoded.indices.to_numpy()
    return indices, crc[indices]


def _mixed(codes: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash (splitmix64 steps) of the codes at ``rows``: one per group."""
    mixed = np.zeros(len(rows), dtype=np.uint64)
    for code in codes:
        mixed = (mixed ^ code[rows]) * np.uint64(0x9E3779B97F4A7C15)
        mixed = (mixed ^ (mixed >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    return mixed ^ (mixed >> np.uint64(29))


def _note(seq: int, text: str) -> pa.Table:
    return pa.table({"seq": [seq], "wall_time": [time.time()], "note": [text]}, schema=fmt.NOTES_SCHEMA)


def write_recording(root: Path, options: Options = Options()) -> Path:
    """Write a synthetic group under ``root`` and return the group folder (what ``comgra --path`` takes).

    With ``options.jobs`` > 1 the trials are written by that many processes at once (each trial has its
    own writer and folder, as the ranks or trials of real runs do); the files are the same either way.
    """
    group_dir = Path(root) / options.group
    names = ["trial_bugged_original_version", "trial_no_activation_function_on_output_layer"]
    trial_ids = [names[i] if i < len(names) else f"trial_{i:03d}" for i in range(options.trials)]
    if options.jobs <= 1 or options.trials <= 1:
        for index, trial_id in enumerate(trial_ids):
            write_trial(group_dir, trial_id, index, options)
        return group_dir
    # spawn, not fork: a forked child would inherit the parent's threads' locks (Arrow's pools, a writer).
    context = multiprocessing.get_context("spawn")
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # a spawned process imports this module by name, with the parent's sys.path
        sys.path.append(here)
    with ProcessPoolExecutor(max_workers=min(options.jobs, options.trials), mp_context=context) as pool:
        futures = [pool.submit(write_trial, group_dir, trial_id, index, options)
                   for index, trial_id in enumerate(trial_ids)]
        for future in futures:
            future.result()
    return group_dir


def _progress(options: Options, trial_id: str, done: int, recorded: int, started: float) -> None:
    """A line about every tenth of a trial when asked (``--progress``): long recordings take minutes."""
    if options.progress and (done == recorded or done * 10 // recorded != (done - options.steps_per_chunk) * 10 // recorded):
        elapsed = time.perf_counter() - started
        print(f"# {trial_id}: {done}/{recorded} steps in {elapsed:.0f} s "
              f"(about {elapsed * (recorded - done) / done:.0f} s left)", file=sys.stderr, flush=True)


def check_disk(group_dir: Path, trial_dir: Path, chunks_done: int, chunks: int, trials: int) -> None:
    """Stop early, naming the sizes, when the recording's extrapolated size would not fit on the disk."""
    written = sum(p.stat().st_size for p in trial_dir.rglob("*.parquet"))
    needed = written * (chunks - chunks_done) / max(1, chunks_done) * trials
    free = shutil.disk_usage(group_dir).free
    if needed * 1.2 > free:  # a merge briefly holds its parts and the merged chunk at once
        raise SystemExit(f"this recording needs about {needed / 2**30:.1f} GiB more, and {group_dir} has "
                         f"{free / 2**30:.1f} GiB free; write fewer steps (--scale) or fewer trials (--trials)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder to write the group folder into")
    parser.add_argument("--scale", type=float, default=1.0, help="1 = tutorial-sized; 50 = 50x the recorded steps")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-per-chunk", type=int, default=25)
    parser.add_argument("--nodes", type=int, default=15, help="15: the tutorial's network; more: a transformer")
    parser.add_argument("--distinct-steps", type=int, default=10**9,
                        help="steps with values of their own; later steps repeat them (writes large graphs fast)")
    parser.add_argument("--jobs", type=int, default=1, help="processes writing trials at once")
    parser.add_argument("--progress", action="store_true", help="a line on stderr about every tenth of a trial")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    options = Options(scale=args.scale, trials=args.trials, seed=args.seed, steps_per_chunk=args.steps_per_chunk,
                      nodes=args.nodes, distinct_steps=args.distinct_steps, jobs=args.jobs, progress=args.progress)
    group_dir = write_recording(args.root, options)
    size = sum(p.stat().st_size for p in group_dir.rglob("*") if p.is_file())
    print(f"wrote {group_dir} ({size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
