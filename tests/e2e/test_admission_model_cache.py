"""spec.model's cache fields at admission, against the real API server: what the model cache can
fetch is accepted, what it cannot is refused with a message naming the field and the fix (the
CEL rules generated from the pydantic models, whose twins tests/unit/test_model_cache.py checks)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.cluster.testing import Kubectl, KubectlError

pytestmark = pytest.mark.e2e

CACHE = {"claimName": "llm-model-cache"}
S3 = {"uri": "s3://models/tiny-llama/", "endpoint": "http://10.240.0.10:7070", "region": "us-east-1",
      "pathStyle": True, "credentialsSecretRef": {"name": "s3-keys"}}  # fmt: skip
HUB = {"uri": "hf://llm-operator/tiny-llama", "endpoint": "http://10.240.0.10:8090",
       "credentialsSecretRef": {"name": "hf-token"}}  # fmt: skip


def tiny(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "cached"},
        "spec": {
            "model": {"name": "llm-operator/tiny-llama", **model},
            "engine": {"backend": "cpu-reference", "maxBatchSize": 8, "maxInputLen": 256, "maxSeqLen": 512,
                       "maxNumTokens": 512},
        },
    }  # fmt: skip


def create(kubectl: Kubectl, namespace: str, doc: dict[str, Any]) -> None:
    kubectl("create", "-f", "-", "--dry-run=server", namespace=namespace, input=json.dumps(doc))


@pytest.mark.parametrize(
    "model",
    [
        {"source": S3, "cache": CACHE},
        {"source": HUB, "cache": CACHE, "revision": "v1"},
        {"source": {"uri": "hf://llm-operator/tiny-llama"}, "cache": CACHE},  # revision: main
        {"source": {"uri": "pvc://models/tiny-llama/v1"}},
        {"source": {"uri": "builtin://tiny-llama"}},
    ],
    ids=["s3", "hf-mirror-pinned", "hf-main", "pvc", "builtin"],
)
def test_the_sources_the_cpu_reference_backend_serves_are_accepted(
    crd: None, kubectl: Kubectl, namespace: str, model: dict[str, Any]
) -> None:
    create(kubectl, namespace, tiny(model))


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"source": {"uri": "s3://models/tiny-llama/"}, "cache": CACHE, "revision": "v2"},
         "model.revision is for hf:// sources (a branch, tag or commit); s3:// sources are keyed by their "
         "objects' ETags (use a new prefix for new weights)"),
        ({"source": {"uri": "builtin://tiny-llama"}, "revision": "r7"},
         "model.revision is for hf:// sources"),
        ({"source": {"uri": "gs://models/tiny-llama/"}, "cache": CACHE},
         "gs:// model sources are not supported (no GCS server to test against); GCS serves the S3 API: "
         "use s3:// with endpoint https://storage.googleapis.com and HMAC keys"),
        ({"source": {"uri": "s3://models/tiny-llama/"}},
         "model.cache.claimName is required for s3:// and hf:// sources"),
        ({"source": {"uri": "hf://llm-operator/tiny-llama"}}, "model.cache.claimName is required"),
        ({"source": {"uri": "pvc://models/tiny-llama"}, "cache": CACHE},
         "model.cache is for s3:// and hf:// sources (pvc:// and builtin:// ones are read in place)"),
        ({"source": {**HUB, "region": "us-east-1"}, "cache": CACHE},
         "model.source.region is for s3:// sources"),
        ({"source": {**HUB, "pathStyle": False}, "cache": CACHE},
         "model.source.pathStyle is for s3:// sources"),
        ({"source": {"uri": "pvc://models/tiny-llama", "endpoint": "http://10.240.0.10:7070"}},
         "model.source.endpoint is for s3:// (an S3-compatible server) and hf:// (a Hub mirror) sources"),
        ({"source": {"uri": "pvc://models/tiny-llama", "credentialsSecretRef": {"name": "k"}}},
         "model.source.credentialsSecretRef is for s3:// and hf:// sources"),
        ({"source": {"uri": "s3://models/tiny-llama/", "endpoint": "http://key:secret@10.240.0.10:7070"},
          "cache": CACHE}, "model.source.endpoint must be http://HOST[:PORT][/PATH] or https://..., with no "
         "credentials in it"),
        ({"source": {"uri": "s3://AKIAEXAMPLE:secret@models/tiny-llama/"}, "cache": CACHE},
         "model.source.uri must not carry credentials (USER:SECRET@)"),
        ({"source": {"uri": "hf://llm-operator/tiny-llama?token=hf_secret"}, "cache": CACHE},
         "model.source.uri takes no query or fragment (a ?token= would show in the fetch Job, status and "
         "Events)"),
    ],
    ids=["revision-s3", "revision-builtin", "gs", "s3-without-cache", "hf-without-cache", "cache-pvc",
         "region-hf", "path-style-hf", "endpoint-pvc", "credentials-pvc", "endpoint-with-credentials",
         "uri-with-userinfo", "uri-with-token-query"],
)  # fmt: skip
def test_what_the_cache_cannot_fetch_is_refused_naming_the_field(
    crd: None, kubectl: Kubectl, namespace: str, model: dict[str, Any], message: str
) -> None:
    with pytest.raises(KubectlError) as err:
        create(kubectl, namespace, tiny(model))
    assert message in err.value.stderr, err.value.stderr
    for credential in ("secret@", "AKIAEXAMPLE", "hf_secret"):
        assert credential not in err.value.stderr, "a credential in a URL is never echoed"
