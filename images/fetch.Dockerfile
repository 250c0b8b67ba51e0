# Fetch image: what engine build Jobs need around NVIDIA's tritonserver trtllm image, which has
# neither store tools nor TensorRT-LLM's examples. Its init container downloads the checkpoint
# (aws, gsutil, hf) and copies the examples of the engine's TensorRT-LLM version into the Job's
# scratch volume; its last container uploads engines to s3:// and gs:// caches. The code it runs
# (llm_operator.engine.fetch) arrives by injection, like the build entry point (render/inject.py),
# so the image carries no package of ours. Pinned by tag; pin by digest in your mirror.

# TensorRT-LLM's examples (convert_checkpoint.py per family, quantization/quantize.py) of every
# release in operator/llm_operator/releases.py (tests/unit/test_images.py keeps the list in step),
# one directory per version: /opt/trtllm-examples/v<version>. Sparse, blob-less clones fetch only
# examples/models and examples/quantization (and the files directly under examples/).
FROM alpine/git:v2.49.1 AS examples
ARG TRTLLM_VERSIONS="0.21.0 1.0.0 1.1.0"
RUN for version in ${TRTLLM_VERSIONS}; do \
        git clone --quiet --depth 1 --branch "v${version}" --filter=blob:none --sparse \
            https://github.com/NVIDIA/TensorRT-LLM.git "/src/${version}" \
        && git -C "/src/${version}" sparse-checkout set examples/models examples/quantization \
        && mkdir -p /opt/trtllm-examples \
        && mv "/src/${version}/examples" "/opt/trtllm-examples/v${version}" \
        && rm -rf "/src/${version}" || exit 1; \
    done

FROM python:3.12-slim
# Store tools in their own environment, pinned.
RUN python -m venv /opt/tools \
    && /opt/tools/bin/pip install --no-cache-dir "awscli==1.46.2" "gsutil==5.38" "huggingface_hub==2.4.0"
ENV PATH=/opt/tools/bin:$PATH
COPY --from=examples /opt/trtllm-examples /opt/trtllm-examples
# The Job runs every container as uid 1000 (runAsNonRoot) with HOME on its scratch volume.
USER 1000:1000
# The Job names the command too: the module is on the injected PYTHONPATH, not in this image.
ENTRYPOINT ["python3", "-m", "llm_operator.engine.fetch"]
