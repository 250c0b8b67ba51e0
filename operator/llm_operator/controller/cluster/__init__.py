"""Talking to the API server: the client, server-side apply, leader election, kopf's RBAC, the queue."""
