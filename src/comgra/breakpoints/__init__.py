"""Live control of a run in progress: breakpoint conditions, breakpoints, run control (see README)."""
