"""The OpenAI-compatible front door of a serving pod (issue 23): chat templates, tokenizers and the
HTTP server beside Triton. Imports only the standard library, jinja2 and tokenizers, which NVIDIA's
images and the cpu-runtime image carry, and h11, which the injected library ships (inject.py)."""
