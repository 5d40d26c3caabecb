"""The app tests without a browser use the synthetic recordings of tests/conftest.py."""
