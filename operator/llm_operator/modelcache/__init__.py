"""The model cache: weights fetched once per (source, revision) into a claim (docs/architecture.md)."""
