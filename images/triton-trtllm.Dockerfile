# Serving image: NVIDIA's Triton + TensorRT-LLM release plus our launcher as the entry point.
# The TensorRT-LLM version must be the operator's LLMOP_TRTLLM_VERSION (engine cache keys contain
# it) and the engine builder's: 25.06 ships TensorRT-LLM 0.20.0. Pinned by tag; pin by digest in
# your mirror.
FROM nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3
LABEL io.llmoperator.tensorrt-llm-version="1.1.0"
ENV LLMOP_TRTLLM_MODELS_DIR=/app/all_models/inflight_batcher_llm
# OpenSSH: multi-node leaders start worker ranks through the workers' sshd (mpirun's launch
# agent); both run unprivileged as the image user, so no privilege-separation directory.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "openssh-server=1:9.6p1-3ubuntu13*" "openssh-client=1:9.6p1-3ubuntu13*" \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
# Only what the launcher imports (prometheus-client's parser, for drain): the operator's own
# dependencies stay out.
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir "prometheus-client>=0.21,<1" \
    && rm -rf /src
WORKDIR /
# uid 1000 exists in the Ubuntu 24.04 base (ssh needs a passwd entry for the user it runs as).
USER 1000:1000
ENTRYPOINT ["llm-operator-launch"]
