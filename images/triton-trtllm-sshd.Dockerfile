# Multi-node serving only: NVIDIA's Triton + TensorRT-LLM image of one release
# (operator/llm_operator/releases.py) plus OpenSSH, nothing of ours. Worker pods' ranks are started
# by the leader's mpirun through their sshd, which NVIDIA's image does not carry
# (triton-inference-server/server build.py adds openssh-server for the fastertransformer backend
# only; TensorRT-LLM's docker/common/install_base.sh installs Open MPI but no OpenSSH; NVIDIA's own
# multi-node Kubernetes guide, triton-inference-server/tutorials
# Deployment/Kubernetes/TensorRT-LLM_Multi-Node_Distributed_Models, starts ranks through
# `kubectl exec` instead). The launcher arrives in the pod like in every other (render/inject.py).
# Single-node pods run NVIDIA's image itself. Pinned by tag; pin by digest in your mirror.
# Build one per release the cluster runs: NGC_TAG and TRTLLM_VERSION from the same row of
# releases.py (the defaults are the default release's; images/README.md lists every row).
ARG NGC_TAG=25.12
FROM nvcr.io/nvidia/tritonserver:${NGC_TAG}-trtllm-python-py3
ARG TRTLLM_VERSION=1.1.0
LABEL io.llmoperator.tensorrt-llm-version="${TRTLLM_VERSION}"
# sshd and ssh run unprivileged as the pod's user (uid 1000, Triton's `triton-server`,
# render/pod.py), so no privilege-separation directory.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "openssh-server=1:9.6p1-3ubuntu13*" "openssh-client=1:9.6p1-3ubuntu13*" \
    && rm -rf /var/lib/apt/lists/*
