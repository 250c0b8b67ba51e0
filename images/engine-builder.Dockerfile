# Engine builder: TensorRT-LLM's release image (convert/quantize scripts, trtllm-build) plus the
# checkpoint fetch tools and our build entry point.
FROM nvcr.io/nvidia/tritonserver:25.04-trtllm-python-py3
RUN pip install --no-cache-dir "awscli==1.40.*" "huggingface_hub[cli]==0.30.*"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip install --no-cache-dir --no-deps . && pip install --no-cache-dir "pydantic>=2.12" "jinja2>=3.1" \
    && rm -rf /src
WORKDIR /
ENTRYPOINT ["python", "-m", "llm_operator.engine.build"]
