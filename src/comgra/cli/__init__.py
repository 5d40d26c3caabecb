"""Command-line entry points: ``comgra`` and ``comgra-test-run``."""
