# Fetch image: the model cache's fetch Job (llm_operator.modelcache.fetch, which this image carries:
# s3:// with boto3, hf:// with huggingface_hub), and what engine build Jobs need around NVIDIA's
# tritonserver trtllm image, which has neither store tools nor TensorRT-LLM's examples: the build's
# init container copies the examples of the engine's TensorRT-LLM version into the Job's scratch
# volume, its last container uploads engines to s3:// and gs:// caches (aws, gsutil). The build's
# code (llm_operator.engine.fetch) arrives by injection (render/inject.py), like the build entry
# point. Pinned by tag; pin by digest in your mirror.

# TensorRT-LLM's examples (convert_checkpoint.py per family, quantization/quantize.py) of every
# release in operator/llm_operator/releases.py (tests/unit/test_images.py keeps the list in step),
# one directory per version: /opt/trtllm-examples/v<version>. Sparse, blob-less clones fetch only
# examples/models and examples/quantization (and the files directly under examples/).
FROM alpine/git:v2.49.1 AS examples
ARG TRTLLM_VERSIONS="0.20.0 0.21.0 1.0.0 1.1.0 1.2.1"
RUN for version in ${TRTLLM_VERSIONS}; do \
        git clone --quiet --depth 1 --branch "v${version}" --filter=blob:none --sparse \
            https://github.com/NVIDIA/TensorRT-LLM.git "/src/${version}" \
        && git -C "/src/${version}" sparse-checkout set examples/models examples/quantization \
        && mkdir -p /opt/trtllm-examples \
        && mv "/src/${version}/examples" "/opt/trtllm-examples/v${version}" \
        && rm -rf "/src/${version}" || exit 1; \
    done

FROM python:3.12-slim
# Store tools and the fetcher's libraries in their own environment, exactly as the locks pin them,
# every file checked against its sha256 (boto3 and huggingface_hub at the versions
# requirements/dev.lock pins, which the tests run; awscli and gsutil at those locks' versions).
COPY requirements/image-fetch.lock requirements/image-fetch-tools.lock /tmp/locks/
RUN python -m venv /opt/tools \
    && /opt/tools/bin/pip install --no-cache-dir --require-hashes --no-deps \
        -r /tmp/locks/image-fetch.lock -r /tmp/locks/image-fetch-tools.lock \
    && rm -rf /tmp/locks
# The python image's PATH with the tools first (no $PATH: images.builder reads ENV literally).
ENV PATH=/opt/tools/bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/llm-operator PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=examples /opt/trtllm-examples /opt/trtllm-examples
# The model cache's fetcher, with the package above it (standard library + boto3 + huggingface_hub).
COPY operator/llm_operator/__init__.py /opt/llm-operator/llm_operator/
COPY operator/llm_operator/modelcache/ /opt/llm-operator/llm_operator/modelcache/
# Bytecode compiled once here, not by every process at its start (images/README.md, "Bytecode").
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash -x '/(sympy|tests?)/' \
    /usr/local/lib/python3.12 /opt/tools/lib/python3.12 /opt/llm-operator
# Jobs run every container as uid 1000 (runAsNonRoot), engine builds with HOME on their scratch volume.
USER 1000:1000
# Engine builds name their command (llm_operator.engine.fetch, injected); fetch Jobs name this one.
ENTRYPOINT ["python3", "-m", "llm_operator.modelcache.fetch"]
