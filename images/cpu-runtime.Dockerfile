# CPU reference runtime: a real tritonserver (from the nvidia-pytriton wheel) serving the tiny
# deterministic model behind the TensorRT-LLM ensemble's API. For development, e2e and laptops.
# Pinned by tag; pin by digest in your mirror.
FROM python:3.11.11-slim-bookworm
# The python image's shared libpython3.11 is what Triton's python-backend stub embeds; the model
# finds torch and llm_operator in this site-packages (modelrepo.CPU_RUNTIME_PYTHON_PATH).
ENV LLMOP_BACKEND=cpu-reference PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY model_repo_templates/ model_repo_templates/
# torch from PyTorch's CPU index: the PyPI wheel bundles CUDA. Same version as the tests use.
# Our package without the operator's dependencies: the launcher and the model need only these, and
# the front door jinja2 (chat templates) and tokenizers (token counts), as NVIDIA's images have them;
# tokenizers without its hub client (reading tokenizer.json needs none). Then the cpu-reference
# models' tokenizer directory (contract.CPU_REFERENCE_TOKENIZER_DIR).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        "torch==1.13.1+cpu" "numpy==1.26.4" "nvidia-pytriton==0.7.0" "prometheus-client>=0.21,<1" \
        "jinja2==3.1.6" "markupsafe==3.0.4" \
    && pip install --no-cache-dir "tokenizers==0.22.2" --no-deps . \
    && python -m llm_operator.runtime.cpu_reference.tokenizer_files /opt/llm-operator/cpu-reference-tokenizer \
    && rm -rf /src \
    && SP=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver \
    && cp "$SP/python_backend_stubs/3.11/triton_python_backend_stub" "$SP/backends/python/"
ENV LLMOP_TRITONSERVER=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver \
    LLMOP_BACKEND_DIR=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/backends \
    LD_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/nvidia_pytriton.libs
WORKDIR /
USER 65532:65532
ENTRYPOINT ["llm-operator-launch"]
