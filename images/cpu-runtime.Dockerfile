# CPU reference runtime: a real tritonserver (from the nvidia-pytriton wheel) serving the tiny
# deterministic model with the TensorRT-LLM ensemble's API. For development, e2e and laptops.
FROM python:3.11.11-slim-bookworm
# Triton's python stub embeds the system libpython3.11.
RUN apt-get update && apt-get install -y --no-install-recommends libpython3.11=3.11.2-6+deb12u* \
    && rm -rf /var/lib/apt/lists/*
ENV LLMOP_BACKEND=cpu-reference \
    LLMOP_PYTHONPATH=/usr/local/lib/python3.11/site-packages
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip install --no-cache-dir . "nvidia-pytriton==0.7.0" "numpy==1.26.4" && rm -rf /src \
    && SP=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver \
    && cp "$SP/python_backend_stubs/3.11/triton_python_backend_stub" "$SP/backends/python/"
ENV LLMOP_TRITONSERVER=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver \
    LLMOP_BACKEND_DIR=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/backends \
    LD_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/nvidia_pytriton.libs
WORKDIR /
USER 65532:65532
ENTRYPOINT ["llm-operator-launch"]
