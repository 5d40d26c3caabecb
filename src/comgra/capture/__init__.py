"""The torch side of recording: registration, autograd traversal, on-device statistics."""
