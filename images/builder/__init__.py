"""Builds the project's images without Docker or a registry, as OCI archives in the cache.

`python -m images.builder [--all | NAME...]`; see images/README.md.
"""
