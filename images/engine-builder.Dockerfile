# Engine builder: the TensorRT-LLM release whose version is in the engine cache key (the same as
# the serving image's), the checkpoint/engine store tools, and our build entry point.
# Pinned by tag; pin by digest in your mirror.
FROM nvcr.io/nvidia/tensorrt-llm/release:1.1.0
LABEL io.llmoperator.tensorrt-llm-version="1.1.0"
ENV LLMOP_TRTLLM_EXAMPLES=/app/tensorrt_llm/examples
# Store tools in their own environment, so they cannot move TensorRT-LLM's dependencies.
RUN python -m venv /opt/tools \
    && /opt/tools/bin/pip install --no-cache-dir "awscli==1.40.*" "gsutil==5.*" "huggingface_hub[cli]==0.30.*" \
    && ln -s /opt/tools/bin/aws /opt/tools/bin/gsutil /opt/tools/bin/huggingface-cli /usr/local/bin/
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir "pydantic>=2.12,<3" "jinja2>=3.1,<4" \
    && rm -rf /src
WORKDIR /
# The Job runs as uid 1000 (runAsNonRoot) with HOME on a scratch volume.
USER 1000:1000
ENTRYPOINT ["python", "-m", "llm_operator.engine.build"]
