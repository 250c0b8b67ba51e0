# CPU reference runtime: a real tritonserver (from the nvidia-pytriton wheel) serving the tiny
# deterministic model behind the TensorRT-LLM ensemble's API. For development, e2e and laptops.
# Like NVIDIA's images in GPU pods, it carries no launcher: the pod's init container copies it in
# from the operator image (render/inject.py) and runs it with this image's python3, so every e2e
# test runs the injection path. The image has what the cpu_reference model imports, nothing more.
# Pinned by tag; pin by digest in your mirror.
FROM python:3.11.11-slim-bookworm
# The python image's shared libpython3.11 is what Triton's python-backend stub embeds; the model
# finds torch in this site-packages and its own package under /opt/llm-operator/cpu-reference
# (modelrepo.CPU_RUNTIME_PYTHON_PATH).
ENV LLMOP_BACKEND=cpu-reference PYTHONDONTWRITEBYTECODE=1
# torch from PyTorch's CPU index: the PyPI wheel bundles CUDA. Same version as the tests use. The
# front door needs jinja2 (chat templates) and tokenizers (token counts), as NVIDIA's images have
# them; tokenizers without its hub client (reading tokenizer.json needs none). The model reads
# cached checkpoints' model.safetensors with safetensors (no dependencies of its own).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==1.13.1+cpu" "numpy==1.26.4" "nvidia-pytriton==0.7.0" "jinja2==3.1.6" "markupsafe==3.0.4" \
    && pip install --no-cache-dir --no-deps "tokenizers==0.22.2" "safetensors==0.8.0" \
    && SP=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver \
    && cp "$SP/python_backend_stubs/3.11/triton_python_backend_stub" "$SP/backends/python/"
# The model's package (runtime/cpu_reference/), whole packages above it so that it is found first
# whatever else is on the path.
COPY operator/llm_operator/__init__.py /opt/llm-operator/cpu-reference/llm_operator/
COPY operator/llm_operator/runtime/__init__.py /opt/llm-operator/cpu-reference/llm_operator/runtime/
COPY operator/llm_operator/runtime/cpu_reference/*.py /opt/llm-operator/cpu-reference/llm_operator/runtime/cpu_reference/
# The cpu-reference models' tokenizer directory (contract.CPU_REFERENCE_TOKENIZER_DIR).
RUN PYTHONPATH=/opt/llm-operator/cpu-reference \
    python -m llm_operator.runtime.cpu_reference.tokenizer_files /opt/llm-operator/cpu-reference-tokenizer
ENV LLMOP_TRITONSERVER=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver \
    LLMOP_BACKEND_DIR=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/backends \
    LD_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/nvidia_pytriton.libs
USER 65532:65532
