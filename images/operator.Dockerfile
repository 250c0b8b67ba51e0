# The operator: `llm-operator run`. Non-root; nothing is written outside /tmp.
# Base pinned by tag (no registry access where this was written); pin by digest in your mirror.
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
# Third-party wheels exactly as the lock pins them, every file checked against its sha256; then our
# package alone (--no-deps), built here, so it has no published hash to check.
COPY requirements/image-operator.lock requirements/
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/image-operator.lock
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY model_repo_templates/ model_repo_templates/
RUN pip install --no-cache-dir --no-deps . && rm -rf /src
# Bytecode compiled once here, not by every process at its start (images/README.md, "Bytecode").
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash -x '/(sympy|tests?)/' /usr/local/lib/python3.11
WORKDIR /
USER 65532:65532
ENTRYPOINT ["llm-operator"]
CMD ["run", "--all-namespaces"]
