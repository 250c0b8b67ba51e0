# Serving image: NVIDIA's Triton + TensorRT-LLM release plus our launcher (the pod's entry point).
# Keep the tag in step with the operator's LLMOP_TRTLLM_VERSION (engine cache keys include it).
FROM nvcr.io/nvidia/tritonserver:25.04-trtllm-python-py3
ENV LLMOP_TRTLLM_MODELS_DIR=/app/all_models/inflight_batcher_llm
# sshd: multi-node leaders start worker ranks over ssh (mpirun's launch agent).
RUN apt-get update && apt-get install -y --no-install-recommends openssh-server=1:8.9p1-3ubuntu0.* \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir "pydantic>=2.12" "jinja2>=3.1" \
    && rm -rf /src
WORKDIR /
ENTRYPOINT ["llm-operator-launch"]
