"""Secrets the operator makes once and never reads: SSH identity, admin key, picker certificate."""
