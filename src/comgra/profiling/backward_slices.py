"""Backward time per module call, attributed so that nothing is counted twice.

A module's backward pass cannot be timed as one span: a module called several times in a step (a
shared block, an RNN cell) shares its parameters between the calls, so every call's span would end
at the same last gradient and the spans would overlap; siblings interleave in the autograd engine's
order. Instead the step's backward pass is cut into slices at the moments the profiler notes:

- a *start*: the gradient reaches a call's output (the autograd node that made it is about to run);
  from then on the time belongs to that call (the innermost one, where a parent returns its child's
  output and both share the moment);
- an *end*: a call of a layer without parameters is complete when its inputs' gradient is; if the
  time belonged to that call or to a call nested in it, it now belongs to the nearest enclosing call
  that has started and not ended (or to none: time outside every profiled module, such as the loss's
  own backward, is nobody's);
- a *finish*: the backward pass has ended (the engine's final callback), and with it every call.

A call with parameters has no end of its own: its parameters' gradients are accumulated once for all
its calls, and hooking every parameter on every step would cost more than the rest of the profiler.

Each slice belongs to exactly one call, and a call's backward time is the sum of its own slices and
those of the calls nested in it (the forward nesting), so a parent contains its children and no
second is counted twice. The rule's approximation: time spent after a call with parameters is done,
in an autograd node of its parent's own or of no profiled module, goes to that call, until the next
start.

Pure Python over plain numbers (no torch), once per profiled step.
"""
from __future__ import annotations

from collections.abc import Sequence


Nesting = tuple[list[int], list[int]]  # per call: its enclosing call (-1 for none) and its depth


def parents_of(subtree_ends: Sequence[int | None]) -> list[int]:
    """The enclosing call of each call (-1 for none), from the calls in the order they began (pre-order)
    and, per call, the index just past its last nested call (None: not known, taken as no nested call)."""
    return nesting_of(subtree_ends)[0]


def attribute(starts: Sequence[float | None], ends: Sequence[float | None], subtree_ends: Sequence[int | None],
              finishes: Sequence[float] = (), nesting: Nesting | None = None
              ) -> tuple[list[float | None], list[float | None]]:
    """Per call (in the order the calls began): its backward time (its slices and its nested calls'; None
    where neither it nor a nested call was reached by a gradient) and the start of its first slice (its own
    start, else its nested calls' earliest). ``nesting``: ``nesting_of(subtree_ends)``, where the caller keeps
    it for steps of the same shape."""
    parents, depths = nesting if nesting is not None else nesting_of(subtree_ends)
    own = _own_slices(starts, ends, subtree_ends, finishes, parents, depths)
    total: list[float | None] = [None if start is None else slice_ for start, slice_ in zip(starts, own)]
    first: list[float | None] = list(starts)
    for index in range(len(starts) - 1, -1, -1):  # children come after their parent: add each to its parent
        parent, time = parents[index], total[index]
        if parent < 0 or time is None:
            continue
        parent_total = total[parent]
        total[parent] = time if parent_total is None else parent_total + time
        if starts[parent] is None:  # a parent's own start wins; an unreached one takes its children's earliest
            child_first, parent_first = first[index], first[parent]
            if child_first is not None and (parent_first is None or child_first < parent_first):
                first[parent] = child_first
    return total, first


def nesting_of(subtree_ends: Sequence[int | None]) -> Nesting:
    parents: list[int] = []
    depths: list[int] = []
    stack: list[int] = []
    stack_ends: list[int] = []
    for index, end in enumerate(subtree_ends):
        while stack_ends and index >= stack_ends[-1]:
            stack.pop()
            stack_ends.pop()
        parents.append(stack[-1] if stack else -1)
        depths.append(len(stack))
        stack.append(index)
        stack_ends.append(index + 1 if end is None else end)
    return parents, depths


_FINISH, _END, _START = 0, 1, 2  # at one moment a finish or an end is taken first: it must not pop a call just started


def _own_slices(starts: Sequence[float | None], ends: Sequence[float | None], subtree_ends: Sequence[int | None],
                finishes: Sequence[float], parents: list[int], depths: list[int]) -> list[float]:
    """The sweep over the step's finishes, ends and starts in time order: each slice to the call it belongs to.
    Starts at one moment (a parent returning its child's output) come outermost first, so the innermost has it."""
    events = [(moment, _START, depths[index], index) for index, moment in enumerate(starts) if moment is not None]
    events += [(moment, _END, 0, index) for index, moment in enumerate(ends)
               if moment is not None and starts[index] is not None]  # a call never reached has no backward to end
    events += [(moment, _FINISH, 0, -1) for moment in finishes]
    events.sort()
    count = len(starts)
    started, ended, own = [False] * count, [False] * count, [0.0] * count
    current, since = -1, 0.0
    for moment, kind, _, index in events:
        if current >= 0:
            own[current] += moment - since
        since = moment
        if kind == _START:
            started[index] = True
            current = index
        elif kind == _END:
            ended[index] = True
            if current >= index and current < _subtree_end(subtree_ends, index):  # it, or a call inside it
                current = _open_ancestor(parents[index], parents, started, ended)
        else:  # the pass has ended, and every call in it
            ended, current = started[:], -1
    return own


def _open_ancestor(index: int, parents: list[int], started: list[bool], ended: list[bool]) -> int:
    while index >= 0 and not (started[index] and not ended[index]):
        index = parents[index]
    return index


def _subtree_end(subtree_ends: Sequence[int | None], index: int) -> int:
    end = subtree_ends[index]
    return index + 1 if end is None else end
