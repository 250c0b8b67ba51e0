"""Secrets the operator makes once and never reads: launch identity, admin key, picker certificate."""
