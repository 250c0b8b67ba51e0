"""routing.mode inference-pool's router: its objects (objects.py), Envoy's bootstrap (envoy.py) and
the limits sized from the deployment (limits.py)."""
