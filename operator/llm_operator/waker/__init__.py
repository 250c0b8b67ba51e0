"""The waker: a small HTTP/1.1 proxy in front of the router's Envoy at autoscaling.minReplicas 0, so
that a streamed request held while the first replica starts gets progress (SSE comments,
`: waking`) instead of silence (docs/autoscaling.md, "Progress while held").

The hold is in the endpoint picker (Envoy's ext_proc holds the request), and Envoy sends nothing
downstream before its upstream's response head; so the bytes have to come from in front of Envoy.
Run as `python3 -m llm_operator.waker` from the operator image (render/router/waker.py).
"""
