"""Breakpoints and run control of a run in progress (see the README's "Breakpoints and run control").

- ``conditions.py``: the condition language (parsed with ``ast`` against a whitelist; no torch);
- ``control.py``: the control channel: the trial's ``live/`` files and a loopback socket, used by the
  app, the REST API and ``comgra.toml``'s checks (no torch);
- ``monitor.py`` and ``metrics.py``: the checks in the training process and their reductions;
- ``recording.py``: the recorder's side (record in full the step where a breakpoint holds); it sees the
  recorder through a ``Protocol`` and never imports it.
"""
