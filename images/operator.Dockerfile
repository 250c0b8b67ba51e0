# The operator: `llm-operator run`, non-root, read-only root filesystem friendly.
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    LLMOP_MODEL_REPO_TEMPLATES=/opt/llm-operator/model_repo_templates
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY model_repo_templates/ /opt/llm-operator/model_repo_templates/
RUN pip install --no-cache-dir . && rm -rf /src
USER 65532:65532
ENTRYPOINT ["llm-operator"]
CMD ["run", "--all-namespaces"]
