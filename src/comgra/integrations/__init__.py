"""Recording without naming tensors by hand: ``comgra.watch`` (every module's output under its dotted
name) and callbacks for the Hugging Face ``Trainer`` (``comgra.integrations.transformers``) and for
Lightning (``comgra.integrations.lightning``).

The optional libraries (``transformers``, ``lightning``) are imported only here, and only by the module
that needs them: importing comgra, or ``comgra.integrations.watch``, imports neither.
"""
