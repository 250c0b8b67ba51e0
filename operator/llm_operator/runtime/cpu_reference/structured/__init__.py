"""The engine contract's guided decoding, log probabilities and n on the CPU runtime
(docs/architecture.md, "Structured outputs, tools, log probabilities and n: the design"): the
grammar (guided.py) and the request's inputs and response tensors for them (sequences.py)."""
