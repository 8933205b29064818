"""Integration-layer fixtures: the live-stack ones come from tests/conftest.py (once per session)."""
