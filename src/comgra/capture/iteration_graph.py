"""The graph of one iteration of a recorded step: the autograd walk from its registered tensors, and the graph
document drawn from it (nodes, edges, layout, hash), reused for an iteration with the same nodes and edges.

A part of ``capture.step.StepRecording`` (its base class), kept apart for the length of the modules."""
from __future__ import annotations

from typing import Any

from comgra.capture import graph as graphs
from comgra.capture.checkpointing import UNSEEN
from comgra.capture.registry import Registration
from comgra.store import format as fmt


class IterationGraphs:
    """The methods of ``StepRecording`` that walk and draw an iteration's graph (it holds the fields)."""

    registrations: dict[tuple[int, str], Registration]
    connections: graphs.Connections
    parameter_aliases: dict[str, list[str]]
    iteration: int
    checkpoints: Any
    report: Any

    # -- the graph of one iteration -----------------------------------------------------------
    def _graph_of_iteration(self, groups_of_parameters: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        memo: dict[Any, frozenset] = {}
        if self.checkpoints.regions:
            self.checkpoints.settle(self)
        targets = [r for r in self.registrations.values() if r.iteration == self.iteration]
        edges: set[tuple[Any, Any]] = set()
        for registration in targets:
            tensor = registration.tensor
            if tensor is None:
                continue
            grad_fn = registration.grad_fn  # the one at registration, not one an in-place op made since
            if registration.same_as is not None:  # the same tensor under a second name
                sources: frozenset = frozenset([registration.same_as])
            else:
                sources = graphs.dependencies(tensor, grad_fn, self.connections, memo)
            edges |= {(source, registration.key) for source in sources if source != registration.key}
        if self.report is not None and self.checkpoints.unseen(memo, self.connections):
            self.report("reentrant-unseen", UNSEEN)
        return self._document(targets, edges, groups_of_parameters)

    def _document(self, targets: list[Registration], edges: set[tuple[Any, Any]],
                  groups_of_parameters: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        """The graph document of this iteration; an iteration with the same nodes and edges as an
        earlier one (every step of a fixed network) reuses that document: layout, hashing and JSON
        cost milliseconds per step on a net with a hundred nodes, the key a tenth of that."""
        keys = {r.key for r in targets} | {k for edge in edges for k in edge}
        cache_key = self._document_key(targets, keys, edges, groups_of_parameters)
        cached = _DOCUMENTS.get(cache_key)
        if cached is None:
            cached = self._new_document(targets, keys, edges, groups_of_parameters)
            if len(_DOCUMENTS) >= _MAX_CACHED_DOCUMENTS:
                _DOCUMENTS.clear()
            _DOCUMENTS[cache_key] = cached
        document, unconnected = cached
        return document, list(unconnected)

    def _document_key(self, targets: list[Registration], keys: set[tuple[int, str]], edges: set[tuple[Any, Any]],
                      groups_of_parameters: dict[str, str]) -> tuple[Any, ...]:
        """Everything the document and the unconnected names are computed from."""
        nodes = []
        for key in sorted(keys):
            r = self.registrations[key]
            nodes.append((key, r.node, r.role, r.tensor_type, r.module_type, r.batch_dim is not None,
                          groups_of_parameters.get(r.tensor_name, ""),
                          tuple(self.parameter_aliases.get(r.tensor_name, ()))))
        return (self.iteration, tuple(nodes), tuple((r.key, r.tensor_name) for r in targets), frozenset(edges))

    def _new_document(self, targets: list[Registration], keys: set[tuple[int, str]], edges: set[tuple[Any, Any]],
                      groups_of_parameters: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
        nodes: dict[str, dict[str, Any]] = {}
        for key in sorted(keys, key=lambda k: (k[0], k[1])):
            registration = self.registrations[key]
            node_id = self._node_id(registration)
            node = nodes.setdefault(node_id, graphs.node_entry(node_id, registration, self.iteration, groups_of_parameters))
            if registration.role not in node["roles"]:
                node["roles"].append(registration.role)
            aliases = self.parameter_aliases.get(registration.tensor_name)
            if aliases:  # a tied parameter: one tensor under several names, recorded under the first
                node.setdefault("aliases", []).extend(a for a in aliases if a not in node.get("aliases", []))
        edge_rows = sorted({(self._node_id(self.registrations[s]), self.registrations[s].role,
                             self._node_id(self.registrations[t]), self.registrations[t].role) for s, t in edges})
        for node_id in graphs.outputs(nodes, [(e[0], e[2]) for e in edge_rows]):
            nodes[node_id]["role"] = "output"
        node_list = list(nodes.values())
        graphs.layout(node_list, [(e[0], e[2]) for e in edge_rows])
        document = {
            "format_version": fmt.FORMAT_VERSION,
            "nodes": node_list,
            "edges": [dict(zip(("source", "source_role", "target", "target_role"), e)) for e in edge_rows],
        }
        document["hash"] = graphs.graph_hash(document)
        touched = {e[0] for e in edge_rows} | {e[2] for e in edge_rows}
        unconnected = [r.tensor_name for r in targets if self._node_id(r) not in touched]
        return document, unconnected

    def _node_id(self, registration: Registration) -> str:
        if registration.iteration < 0 or registration.iteration == self.iteration:
            return registration.node
        back = self.iteration - registration.iteration
        return f"{registration.node}*old" + ("" if back == 1 else str(back))


# Graph documents by everything they are computed from (StepRecording._document_key), shared by the
# steps of a process; documents are never changed once made. Cleared when full: a network whose
# graph changes every step would otherwise grow it without end.
_DOCUMENTS: dict[tuple[Any, ...], tuple[dict[str, Any], list[str]]] = {}
_MAX_CACHED_DOCUMENTS = 256
