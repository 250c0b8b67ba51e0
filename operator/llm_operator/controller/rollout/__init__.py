"""Canary rollouts: the decisions on each pass, the metric analysis, and the Prometheus URLs it may query."""
