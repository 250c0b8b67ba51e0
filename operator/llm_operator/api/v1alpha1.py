"""The LLMDeployment API, version v1alpha1: the single source of the CRD schema.

Everything a user can write is declared here. The CRD in crds/ is generated from these models
(`make crds`), and the cross-field rules below are emitted as CEL (x-kubernetes-validations) so the
API server rejects bad manifests at admission with the message written next to each rule.
Conventions: camelCase on the wire, integer durations named ...Seconds/...Microseconds, no floats
in spec (fractions are integer percents), lists of named objects rather than maps.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel, to_snake

from llm_operator.runtime.cpu_reference import BUILTIN_MODELS

GROUP = "llmoperator.io"
VERSION = "v1alpha1"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
SINGULAR = "llmdeployment"
SHORT_NAMES = ["llmd"]
API_VERSION = f"{GROUP}/{VERSION}"

# The models the CPU reference runtime ships (model.source.uri of the cpu-reference backend).
BUILTIN_URIS = [f"builtin://{name}" for name in BUILTIN_MODELS]
MAX_WORLD_SIZE = 64
POWERS_OF_TWO = [1, 2, 4, 8, 16, 32, 64]

# GPU products older than Ada (compute capability < 8.9): no FP8 tensor cores. Matched on the GFD
# product string; unknown products pass admission and are checked against the node inventory.
PRE_ADA_PRODUCT_REGEX = r"^(NVIDIA-A[0-9]+|NVIDIA-RTX-A[0-9]+|Tesla-|NVIDIA-TITAN|Quadro-)"

Rule = dict[str, str]


def rules(*items: Rule) -> dict[str, Any]:
    """json_schema_extra carrying CEL rules onto a model's schema."""
    return {"x-kubernetes-validations": list(items)}


def cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> Rule:
    r = {"rule": rule, "message": message}
    if field_path:
        r["fieldPath"] = field_path
    if reason:
        r["reason"] = reason
    return r


class Spec(BaseModel):
    """Base for every API object: camelCase aliases, unknown fields rejected, immutable values."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


# A count of GPUs in a parallel dimension, or "auto" to let the planner choose.
ParallelDegree = Annotated[
    int | Literal["auto"],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [
                cel(
                    "type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)",
                    "must be an integer from 1 to 64, or 'auto'",
                ),
                cel(
                    "type(self) == string || self in [1, 2, 4, 8, 16, 32, 64]",
                    "must be a power of two (1, 2, 4, 8, 16, 32 or 64): TensorRT-LLM shards "
                    "attention heads and layers evenly",
                ),
            ],
        }
    ),
]

# A GPU Feature Discovery product string (nvidia.com/gpu.product), e.g. NVIDIA-H100-80GB-HBM3.
GpuProduct = Annotated[str, Field(min_length=1, max_length=128)]

# A Kubernetes resource.Quantity written as a string ("1", "500m", "16Gi").
Quantity = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": 64,
            "x-kubernetes-validations": [
                cel("isQuantity(self)", "must be a Kubernetes quantity such as 1, 500m or 16Gi")
            ],
        }
    ),
]

# Pass-through Kubernetes objects that this API does not re-declare (tolerations, HPA behavior).
PassThrough = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


# ---------------------------------------------------------------------------------------------
# spec.model


class ModelArchitecture(Spec):
    """Transformer shape, used for memory planning and sharding checks."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.hiddenSize % self.numAttentionHeads == 0",
                "hiddenSize must be divisible by numAttentionHeads",
            ),
            cel(
                "!has(self.numKeyValueHeads) || self.numAttentionHeads % self.numKeyValueHeads == 0",
                "numAttentionHeads must be a multiple of numKeyValueHeads (grouped-query attention)",
            ),
        )
    )

    num_layers: int = Field(
        ge=1,
        le=1024,
        description="Transformer layers (num_hidden_layers in the checkpoint's config.json), 1-1024; "
        "parallelism.pipeline must divide it.",
    )
    hidden_size: int = Field(
        ge=1,
        le=1 << 20,
        description="Hidden size (hidden_size); must be divisible by numAttentionHeads.",
    )
    num_attention_heads: int = Field(
        ge=1,
        le=4096,
        description="Attention heads per layer (num_attention_heads), 1-4096; parallelism.tensor must "
        "divide it.",
    )
    num_key_value_heads: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Key/value heads (num_key_value_heads: grouped-query attention), 1-4096; must "
        "divide numAttentionHeads. Unset: numAttentionHeads (no GQA).",
    )
    vocab_size: int = Field(
        ge=1,
        le=1 << 24,
        description="Vocabulary size (vocab_size); sizes the embeddings and logits in the memory plan.",
    )
    parameter_count: int = Field(
        ge=1,
        description="Total parameters as an integer, e.g. 70600000000; sizes the weights in the memory plan.",
    )
    intermediate_size: int | None = Field(
        default=None,
        ge=1,
        description="MLP size (intermediate_size); sizes activations in the memory plan. Unset: 4 x "
        "hiddenSize.",
    )
    max_position_embeddings: int | None = Field(
        default=None,
        ge=1,
        description="The model's trained context length (max_position_embeddings). Informational: "
        "planning does not read it; engine.maxSeqLen bounds what is served.",
    )

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class LocalObjectReference(Spec):
    name: str = Field(
        min_length=1, max_length=253, description="The Secret's name, in the LLMDeployment's namespace."
    )


GS_REFUSED = (
    "gs:// model sources are not supported (no GCS server to test against); GCS serves the S3 API: "
    "use s3:// with endpoint https://storage.googleapis.com and HMAC keys"
)
ENDPOINT = r"^https?://[^ /?#@]+(/[^ ?#@]*)?$"
ENDPOINT_MESSAGE = (
    "model.source.endpoint must be http://HOST[:PORT][/PATH] or https://..., with no credentials in "
    "it (they come from model.source.credentialsSecretRef)"
)
URI_USERINFO = r"^[a-z0-9]+://[^/]*@"
URI_USERINFO_MESSAGE = (
    "model.source.uri must not carry credentials (USER:SECRET@): they would show in the fetch Job, "
    "status and Events; put them in the Secret model.source.credentialsSecretRef names"
)
URI_QUERY = r"[?#]"
URI_QUERY_MESSAGE = (
    "model.source.uri takes no query or fragment (a ?token= would show in the fetch Job, status and "
    "Events): credentials go in the Secret model.source.credentialsSecretRef names, a revision in "
    "model.revision"
)
# Sources the fetch Job downloads into spec.model.cache (pvc:// is read in place, builtin:// ships
# in the cpu-runtime image).
CACHED_SCHEMES = ("s3://", "hf://")


class ModelSource(Spec):
    """Where the model's checkpoint and tokenizer are read from, and how to reach them. The fields
    other than uri are refused where they do not apply to its scheme."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.credentialsSecretRef) || self.uri.matches('^(s3|hf)://')",
                "model.source.credentialsSecretRef is for s3:// and hf:// sources (nothing downloads "
                "pvc:// or builtin:// ones): remove it",
            ),
            cel(
                "!has(self.endpoint) || self.uri.matches('^(s3|hf)://')",
                "model.source.endpoint is for s3:// (an S3-compatible server) and hf:// (a Hub "
                "mirror) sources: remove it",
            ),
            cel(
                "!has(self.region) || self.uri.startsWith('s3://')",
                "model.source.region is for s3:// sources: remove it",
            ),
            cel(
                "!has(self.pathStyle) || self.uri.startsWith('s3://')",
                "model.source.pathStyle is for s3:// sources: remove it",
            ),
        )
    )

    uri: str = Field(
        max_length=1024,
        description="Where the checkpoint and tokenizer live: s3://BUCKET/PREFIX and hf://ORG/NAME "
        "(fetched once into model.cache), pvc://CLAIM/PATH (read in place), or builtin://NAME for "
        "the models shipped in the CPU reference runtime. gs:// is refused: use s3:// with GCS's "
        "S3 endpoint.",
        json_schema_extra=rules(
            cel(
                "self.matches('^(s3|gs|pvc|hf|builtin)://[^ ]+$')",
                "model.source.uri must start with s3://, pvc://, hf:// or builtin://",
            ),
            cel("!self.startsWith('gs://')", f"model.source.uri: {GS_REFUSED}"),
            cel(f"!self.matches('{URI_USERINFO}')", URI_USERINFO_MESSAGE),
            cel(f"!self.matches('{URI_QUERY}')", URI_QUERY_MESSAGE),
        ),
    )
    endpoint: str | None = Field(
        default=None,
        max_length=1024,
        description="s3://: the S3-compatible server (unset: AWS). hf://: a Hugging Face Hub mirror "
        "(HF_ENDPOINT; unset: huggingface.co). http:// or https://, no credentials in it.",
        # A CEL rule, not a pattern: the API server quotes a value that fails a pattern, and a
        # mistaken endpoint may carry credentials.
        json_schema_extra=rules(cel(f"self.matches('{ENDPOINT}')", ENDPOINT_MESSAGE)),
    )
    region: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9-]+$",
        description="s3:// only: the bucket's region (unset: the server's default).",
    )
    path_style: bool | None = Field(
        default=None,
        description="s3:// only: address buckets as ENDPOINT/BUCKET rather than BUCKET.ENDPOINT "
        "(most self-hosted servers need it). Unset: false.",
    )
    credentials_secret_ref: LocalObjectReference | None = Field(
        default=None,
        description="Secret in the LLMDeployment's namespace whose keys become the environment of "
        "the model's fetch Job, and of nothing else: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and "
        "AWS_SESSION_TOKEN for s3://, HF_TOKEN for hf://. Unset: no Secret is mounted (workload "
        "identity through runtime.serviceAccountName, or a public model). Only the name is read, "
        "never the Secret.",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint_without_credentials(cls, endpoint: str | None) -> str | None:  # the CEL rule's twin
        if endpoint is not None and not re.match(ENDPOINT, endpoint):
            raise ValueError(ENDPOINT_MESSAGE)
        return endpoint

    @field_validator("uri")
    @classmethod
    def _uri_without_credentials(cls, uri: str) -> str:  # the CEL rules' twins
        if re.match(URI_USERINFO, uri):
            raise ValueError(URI_USERINFO_MESSAGE)
        if re.search(URI_QUERY, uri):
            raise ValueError(URI_QUERY_MESSAGE)
        return uri

    @model_validator(mode="after")
    def _fields_of_scheme(self) -> ModelSource:  # the CEL rules' twins
        if self.uri.startswith("gs://"):
            raise ValueError(f"model.source.uri: {GS_REFUSED}")
        cached = self.uri.startswith(CACHED_SCHEMES)
        if self.credentials_secret_ref is not None and not cached:
            raise ValueError("model.source.credentialsSecretRef is for s3:// and hf:// sources: remove it")
        if self.endpoint is not None and not cached:
            raise ValueError("model.source.endpoint is for s3:// and hf:// sources: remove it")
        for value, name in ((self.region, "region"), (self.path_style, "pathStyle")):
            if value is not None and not self.uri.startswith("s3://"):
                raise ValueError(f"model.source.{name} is for s3:// sources: remove it")
        return self


class ModelCache(Spec):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="A PersistentVolumeClaim in the LLMDeployment's namespace that holds fetched "
        "models (ReadWriteMany when pods span nodes). The fetch Job writes it; engine builds and "
        "serving pods mount it read-only. Several deployments may name one claim: a model and "
        "revision already fetched into it is not fetched again. The operator never deletes it or "
        "anything in it.",
    )


# Which TensorRT-LLM checkpoint converter an engine build runs (engine/build.py CONVERTERS).
class ModelFamily(StrEnum):
    LLAMA = "llama"
    MISTRAL = "mistral"
    MIXTRAL = "mixtral"
    QWEN = "qwen"
    GEMMA = "gemma"
    FALCON = "falcon"


# How the front door reads tool calls out of a model's text (frontdoor/tools/): vLLM's
# --tool-call-parser names for the same formats.
class ToolCallParser(StrEnum):
    HERMES = "hermes"
    LLAMA3_JSON = "llama3-json"
    MISTRAL = "mistral"


REVISION_REFUSED = (
    "model.revision is for hf:// sources (a branch, tag or commit); s3:// sources are keyed by their "
    "objects' ETags (use a new prefix for new weights), pvc:// and builtin:// ones are read as they "
    "are: remove it"
)
CACHE_REQUIRED = (
    "model.cache.claimName is required for s3:// and hf:// sources: name a PersistentVolumeClaim "
    "(ReadWriteMany when pods span nodes) that the fetch Job downloads the model into"
)
CACHE_REFUSED = (
    "model.cache is for s3:// and hf:// sources (pvc:// and builtin:// ones are read in place): remove it"
)


class ModelSpec(Spec):
    """The model to serve: its name, where its checkpoint comes from and, optionally, its shape."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.alias) || self.alias != self.name",
                "model.alias names the model a second time: remove it, or choose a name other than "
                "model.name",
            ),
            cel("!has(self.revision) || self.source.uri.startsWith('hf://')", REVISION_REFUSED),
            cel("has(self.cache) || !self.source.uri.matches('^(s3|hf)://')", CACHE_REQUIRED),
            cel("!has(self.cache) || self.source.uri.matches('^(s3|hf)://')", CACHE_REFUSED),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=253,
        description="Model name, e.g. meta-llama/Meta-Llama-3-70B-Instruct. Immutable: a different "
        "model is a different LLMDeployment.",
        json_schema_extra=rules(
            cel(
                "self == oldSelf",
                "model.name is immutable: create a new LLMDeployment to serve a different model",
            )
        ),
    )
    alias: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="A second name the OpenAI API serves the model under, beside model.name (e.g. "
        "llama-3-8b for meta-llama/Meta-Llama-3-8B-Instruct): /v1/models lists both and requests may "
        "name either. Letters, digits and . _ / : - only.",
    )
    source: ModelSource
    revision: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="hf:// only: the branch, tag or commit to fetch (unset: main). The resolved "
        "commit goes into status.model and the engine cache key. s3:// sources are keyed by their "
        "objects' ETags (use a new prefix for new weights); pvc:// and builtin:// are read as "
        "they are.",
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Where s3:// and hf:// models are fetched to (required for them, refused for "
        "the others): fetched once per claim, source and revision, then read by every deployment "
        "that names the same.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Optional when the model is in the operator's catalogue of known architectures "
        "(docs/placement.md); given, it wins over the catalogue. Without either, parallelism 'auto' "
        "is refused at planning and explicit tensor and pipeline skip the memory check.",
    )
    family: ModelFamily | None = Field(
        default=None,
        description="The model family, which picks the checkpoint converter of an engine build. "
        "Unset: told from model.name (Llama, Mistral, Mixtral, Qwen, Gemma and Falcon names); a "
        "build of a model whose family cannot be told is refused at planning.",
    )
    tool_call_parser: ToolCallParser | None = Field(
        default=None,
        description="How the OpenAI API reads tool calls out of the model's text when a chat request "
        "sends tools with tool_choice auto (the model decides): hermes (<tool_call>{...}</tool_call>: "
        "Qwen2.5, Qwen3, Hermes), llama3-json (Llama 3.1+ JSON tool calls) or mistral ([TOOL_CALLS] "
        "then a JSON array). Unset: tool_choice auto is refused; none, required and a named "
        "function work without it.",
    )

    @model_validator(mode="after")
    def _revision_and_cache(self) -> ModelSpec:  # the CEL rules' twins
        uri = self.source.uri
        if self.revision is not None and not uri.startswith("hf://"):
            raise ValueError(REVISION_REFUSED)
        if self.cache is None and uri.startswith(CACHED_SCHEMES):
            raise ValueError(CACHE_REQUIRED)
        if self.cache is not None and not uri.startswith(CACHED_SCHEMES):
            raise ValueError(CACHE_REFUSED)
        return self

    @property
    def requested_revision(self) -> str | None:
        """What the fetch asks for: hf:// defaults to main; other sources have none."""
        if self.source.uri.startswith("hf://"):
            return self.revision or "main"
        return None


# ---------------------------------------------------------------------------------------------
# spec.engine


class Backend(StrEnum):
    """tensorrt-engine: TensorRT engines (built by a Job, or prebuilt) behind Triton's
    inflight_batcher_llm models. pytorch: the checkpoint itself, loaded by TensorRT-LLM's LLM API on
    its PyTorch backend behind Triton's llmapi model (no engine build; every release in releases.py).
    cpu-reference: the operator's CPU runtime, for development and tests (its builtin:// models, or
    a checkpoint in its format)."""

    TENSORRT_ENGINE = "tensorrt-engine"
    PYTORCH = "pytorch"
    CPU_REFERENCE = "cpu-reference"


class Precision(StrEnum):
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8_SQ = "int8-sq"
    INT4_AWQ = "int4-awq"
    W4A8_AWQ = "w4a8-awq"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


# Serving pods and build Jobs mount engines from a ReadWriteMany claim; object-store caches would
# need a sync step that does not exist yet, so they are refused here rather than failing in pods.
PVC_URI = r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^ ]*)?$"
STORAGE_URI_MESSAGE = (
    "must be pvc://CLAIM/PATH (a ReadWriteMany PersistentVolumeClaim); object-store engine caches "
    "are not supported yet"
)
# No pydantic twin: an object stored under the first CRD (which took s3:// and gs://) is refused at
# planning (desired.py), where it needs the engines.
STORAGE_URI_RULE = cel(f"self.matches('{PVC_URI}')", STORAGE_URI_MESSAGE)


class PrebuiltEngine(Spec):
    uri: str = Field(
        max_length=1024,
        description="Engines already built for this model, precision, tp, pp and GPU architecture: "
        "pvc://CLAIM/PATH on a ReadWriteMany claim (other schemes are refused).",
        json_schema_extra=rules(STORAGE_URI_RULE),
    )


QUANTIZED_PRECISIONS = ["fp8", "int8-sq", "int4-awq", "w4a8-awq"]
QUANTIZED_KV_CACHES = ["fp8", "int8"]
CALIBRATION_HINT = (
    "set engine.build.calibration.datasetUri to pvc://CLAIM/PATH (a dataset directory on a "
    "claim: its train split, text column) or hf://ORG/cnn_dailymail (downloaded from the Hub)"
)


class Calibration(Spec):
    dataset_uri: str = Field(
        max_length=1024,
        description="The calibration dataset of quantized builds (ModelOpt quantize.py "
        "--calib_dataset): pvc://CLAIM/PATH, a dataset directory mounted read-only in the build "
        "Job (its train split and text column are read; a path naming cnn_dailymail is read as a "
        "copy of that Hub dataset, config 3.0.0), or hf://ORG/cnn_dailymail, the one Hub dataset "
        "upstream's loader reads by name; only then does the build reach the Hub for it.",
        json_schema_extra=rules(
            cel(
                "self.matches('^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[^ ]+$') "
                "|| self.matches('^hf://[^ /]+/cnn_dailymail$')",
                "engine.build.calibration.datasetUri must be pvc://CLAIM/PATH (a dataset directory "
                "on a claim) or hf://ORG/cnn_dailymail",
            )
        ),
    )
    size: int = Field(
        default=512, ge=1, le=65536, description="Calibration samples (--calib_size), 1-65536; default 512."
    )


class EngineBuild(Spec):
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Image of the build step (default: NVIDIA's tritonserver trtllm image of the release).",
    )
    tensorrt_llm_version: str | None = Field(
        default=None,
        max_length=32,
        description="TensorRT-LLM version of the builder and runtime; part of the cache key (an "
        "engine loads only in the version that built it). Unset: the deployment's release's (annotation "
        "llmoperator.io/tensorrt-llm-version, docs/upgrading.md). "
        "Another version needs runtime.image and engine.build.image of that version, else the "
        "deployment is Stalled at planning.",
    )
    active_deadline_seconds: int = Field(
        default=14400,
        ge=60,
        le=7 * 86400,
        description="Seconds an engine-build Job may run before it fails (the Job's "
        "activeDeadlineSeconds), 60 to 604800; default 14400 (4 h).",
    )
    backoff_limit: int = Field(
        default=1,
        ge=0,
        le=10,
        description="Retries of a failed engine-build pod (the Job's backoffLimit), 0-10; default 1.",
    )
    calibration: Calibration | None = Field(
        default=None,
        description="Required to build quantized precisions and quantized KV caches (checked at "
        "planning: fp8 models too large to quantize on the build's GPUs convert without it); no Hub "
        "access unless it names a Hub dataset.",
    )


class EngineCache(Spec):
    uri: str = Field(
        default="pvc://llm-engine-cache/engines",
        max_length=1024,
        description="Where built engines are stored, under one directory per cache key: "
        "pvc://CLAIM/PATH on a ReadWriteMany claim (other schemes are refused); default "
        "pvc://llm-engine-cache/engines.",
        json_schema_extra=rules(STORAGE_URI_RULE),
    )


class CpuContract(StrEnum):
    """The GPU contract a cpu-reference deployment's CPU runtime speaks (docs/architecture.md, "Two
    GPU contracts, one CPU runtime")."""

    TENSORRT_ENGINE = "tensorrt-engine"
    PYTORCH = "pytorch"


class CpuReferenceSpec(Spec):
    """Settings of the cpu-reference backend only."""

    contract: CpuContract = Field(
        default=CpuContract.PYTORCH,
        description="Which GPU backend's Triton contract the CPU runtime speaks: pytorch (default, "
        "as engine.backend's: the llmapi model `tensorrt_llm`, sampling_param_* inputs, the whole "
        "text so far in each response, finish_reason; load gauges from the engine's iteration "
        "stats) or tensorrt-engine (the ensemble of inflight_batcher_llm, text in, a response per "
        "token; the default before pytorch, docs/upgrading.md), so one CPU test world runs either "
        "shape. A cpu-reference deployment without engine.cpuReference speaks the default.",
    )


# What the pytorch backend refuses in spec.engine: (CEL rule, message, the rule's pydantic twin).
# engine.backend defaults to pytorch, so a manifest written for engines that leaves the backend out
# meets these, and each names the way back to engines.
KEEP_ENGINES = ", or set engine.backend: tensorrt-engine (engine.backend defaults to pytorch)"
PYTORCH_ENGINE_RULES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    (
        "(!has(self.prebuilt) && !has(self.build))",
        "the pytorch backend loads the checkpoint itself and builds no engine: remove "
        "engine.prebuilt and engine.build",
        lambda e: e.prebuilt is None and e.build is None,
    ),
    (
        "self.precision in ['fp16', 'bf16']",
        "the pytorch backend serves the checkpoint as stored (a pre-quantized checkpoint carries its "
        "own quantization): set engine.precision to fp16 or bf16",
        lambda e: e.precision in (Precision.FP16, Precision.BF16),
    ),
    (
        "self.kvCacheDtype == 'auto'",
        "the pytorch backend takes the KV-cache dtype from the checkpoint: set engine.kvCacheDtype to auto",
        lambda e: e.kv_cache_dtype == KvCacheDtype.AUTO,
    ),
    (
        "self.maxBeamWidth == 1",
        "the pytorch backend serves sampling only (Triton's llmapi model has no beam outputs): set "
        "engine.maxBeamWidth to 1",
        lambda e: e.max_beam_width == 1,
    ),
)


class EngineSpec(Spec):
    """How the model is served: the backend, the numeric precision and the engine's limits (batch,
    sequence and token counts), and where engines come from (built by a Job, or prebuilt)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.maxSeqLen >= self.maxInputLen",
                "engine.maxSeqLen must be at least engine.maxInputLen (it counts input and output tokens)",
            ),
            cel(
                "!(has(self.prebuilt) && has(self.build))",
                "set engine.prebuilt (use existing engines) or engine.build (build them), not both",
            ),
            cel(
                "self.backend != 'cpu-reference' || self.precision in ['fp16', 'bf16']",
                "the cpu-reference backend runs fp16/bf16 checkpoints only",
            ),
            cel(
                "self.backend == 'cpu-reference' || !has(self.cpuReference)",
                "engine.cpuReference applies to the cpu-reference backend only: remove it, or set "
                "engine.backend to cpu-reference",
            ),
            *(
                cel(f"self.backend != 'pytorch' || {rule}", message + KEEP_ENGINES)
                for rule, message, _ in PYTORCH_ENGINE_RULES
            ),
        )
    )

    backend: Backend = Field(
        default=Backend.PYTORCH,
        description="Default pytorch (tensorrt-engine before it: objects created then keep it, "
        "docs/upgrading.md). pytorch and cpu-reference refuse the settings they cannot apply "
        "(docs/api.md, Backends).",
    )
    precision: Precision = Field(
        default=Precision.FP16,
        description="Numeric format of the weights: fp16 (default), bf16, or the quantized fp8, "
        "int8-sq (SmoothQuant), int4-awq and w4a8-awq, which an engine build calibrates "
        "(engine.build.calibration). fp8 and w4a8-awq need Ada/Hopper or newer GPU products; the "
        "pytorch and cpu-reference backends take fp16 or bf16 only.",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=KvCacheDtype.AUTO,
        description="Element type of the KV cache: auto (default: 16 bits; the pytorch backend's is the "
        "checkpoint's), fp16, bf16, "
        "or the quantized fp8 and int8 (half the KV memory; built with engine.build.calibration). "
        "fp8 needs Ada/Hopper or newer GPU products; the pytorch backend takes auto only.",
    )
    max_batch_size: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Most requests served at once, 1-4096; default 64. Sizes the KV cache and "
        "activations in the memory plan; part of the engine's cache key.",
    )
    max_input_len: int = Field(
        default=4096,
        ge=1,
        le=1 << 20,
        description="Longest prompt in tokens, 1 to 1048576; default 4096. Longer prompts are refused. "
        "engine.maxSeqLen must be at least this, and so must engine.maxNumTokens unless "
        "runtime.chunkedContext is true.",
    )
    max_seq_len: int = Field(
        default=8192,
        ge=1,
        le=1 << 21,
        description="Longest sequence in tokens, prompt and output together, 1 to 2097152; default "
        "8192. Must be at least engine.maxInputLen.",
    )
    max_num_tokens: int = Field(
        default=8192,
        ge=1,
        le=1 << 20,
        description="Most tokens processed in one step over the whole batch, 1 to 1048576; default "
        "8192. Sizes activations; must be at least engine.maxInputLen unless runtime.chunkedContext "
        "is true.",
    )
    max_beam_width: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Most beams of beam search, 1-8; default 1 (sampling only). The pytorch backend "
        "takes 1 only.",
    )
    prebuilt: PrebuiltEngine | None = Field(
        default=None,
        description="Serve engines that already exist instead of building them (the tensorrt-engine "
        "backend). Refused together with engine.build, and with the pytorch backend (the default).",
    )
    build: EngineBuild | None = Field(
        default=None,
        description="How the engine-build Job runs. Unset, and no engine.prebuilt: the "
        "tensorrt-engine backend builds with the defaults. Refused with the pytorch backend (the "
        "default).",
    )
    cpu_reference: CpuReferenceSpec | None = Field(
        default=None,
        description="Settings of the cpu-reference backend (refused with the others).",
    )
    cache: EngineCache = Field(
        default_factory=EngineCache,
        description="Where built engines are kept, one directory per cache key (model and revision, "
        "precision and KV-cache type, parallelism, limits, GPU architecture, TensorRT-LLM version), "
        "so deployments that name the same place share them.",
    )

    @model_validator(mode="after")
    def _pytorch_builds_no_engine(self) -> EngineSpec:  # the CEL rules' twins, for `llm-operator render`
        if self.backend == Backend.PYTORCH:
            for _, message, holds in PYTORCH_ENGINE_RULES:
                if not holds(self):
                    raise ValueError(message + KEEP_ENGINES)
        return self


# ---------------------------------------------------------------------------------------------
# spec.parallelism


class ParallelismSpec(Spec):
    """How many GPUs one replica shards the model over: tensor x pipeline, at most 64."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "type(self.tensor) == string || type(self.pipeline) == string || "
                f"self.tensor * self.pipeline <= {MAX_WORLD_SIZE}",
                f"tensor * pipeline must not exceed {MAX_WORLD_SIZE} GPUs per replica",
            ),
        )
    )

    tensor: ParallelDegree = Field(
        default=1,
        description="GPUs each layer is split over (tensor parallelism): a power of two from 1 to 64, "
        "or 'auto' for the planner to choose from the model's shape and the cluster's GPUs; default "
        "1. Must divide model.architecture.numAttentionHeads.",
    )
    pipeline: ParallelDegree = Field(
        default=1,
        description="Stages the layers are split into (pipeline parallelism): a power of two from 1 "
        "to 64, or 'auto' for the planner to choose; default 1. Must divide "
        "model.architecture.numLayers.",
    )

    @property
    def is_auto(self) -> bool:
        return self.tensor == "auto" or self.pipeline == "auto"


# ---------------------------------------------------------------------------------------------
# spec.runtime


class Profile(StrEnum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
    BALANCED = "balanced"


class BatchingStrategy(StrEnum):
    INFLIGHT_FUSED = "inflight-fused"
    INFLIGHT = "inflight"
    STATIC = "static"


class SchedulerPolicy(StrEnum):
    GUARANTEED_NO_EVICT = "guaranteed-no-evict"
    MAX_UTILIZATION = "max-utilization"


class BatchingSpec(Spec):
    """How Triton batches and queues requests; unset fields take the profile's values
    (docs/runtime.md). The pytorch backend refuses all of it, cpu-reference all but
    maxQueueDelayMicroseconds and maxQueueSize."""

    strategy: BatchingStrategy | None = Field(
        default=None,
        description="inflight-fused, inflight or static (the tensorrt_llm model's gpt_model_type: "
        "inflight_fused_batching, inflight_batching, V1). Unset: the profile's (inflight-fused).",
    )
    max_queue_delay_microseconds: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="Microseconds Triton's dynamic batcher may hold a request to form a larger batch, "
        "0 to 10000000. Unset: the profile's (0, 500 or 2000).",
    )
    max_queue_size: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="The engine's queue bound, 0 for none, up to 1000000. Unset: the profile's for "
        "TensorRT-LLM, none for cpu-reference (a bound costs its requests up to 500 ms: "
        "docs/runtime.md).",
    )
    scheduler_policy: SchedulerPolicy | None = Field(
        default=None,
        description="TensorRT-LLM's batch scheduler policy: guaranteed-no-evict admits a request only "
        "when the KV cache can hold it to the end; max-utilization admits more and pauses requests "
        "when the cache runs out. Unset: the profile's.",
    )


class KvCacheSpec(Spec):
    """The paged KV cache; unset fields take the profile's values (docs/runtime.md). The pytorch
    backend refuses hostMemoryBytes, cpu-reference all of it (it has no KV-cache pool)."""

    free_gpu_memory_percent: int | None = Field(
        default=None,
        ge=1,
        le=99,
        description="Percent of GPU memory left after weights that the KV cache may take, 1-99. Unset: "
        "the profile's (85, 90 or 95).",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Upper bound on KV-cache tokens (the pool is the smaller of this and "
        "freeGpuMemoryPercent's share). Unset: no bound below what the engine can hold at once.",
    )
    block_reuse: bool | None = Field(
        default=None,
        description="Prefix caching: KV-cache blocks of a prompt prefix served before are reused. "
        "Unset: the profile's (on).",
    )
    host_memory_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes of host memory KV-cache blocks may be offloaded to. Unset: 0, none.",
    )


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
RESERVED_ENV_PREFIX = "LLMOP_"  # the serving pod contract (docs/launcher-and-engines.md)
# ...except the CPU reference runtime's test-only fault knob (runtime/cpu_reference/faults.py).
FAULT_ENV_PREFIX = "LLMOP_FAULT_"
RESERVED_LABEL_PREFIXES = (f"{GROUP}/", "app.kubernetes.io/")


class KeyReference(Spec):
    name: str = Field(
        min_length=1, max_length=253, description="The Secret or ConfigMap, in the LLMDeployment's namespace."
    )
    key: str = Field(min_length=1, max_length=253, description="The key whose value the variable takes.")
    optional: bool | None = Field(
        default=None,
        description="true: a missing object or key leaves the variable unset. Unset or false: the "
        "container does not start without it.",
    )


class EnvVarSource(Spec):
    """A value read from a Secret or a ConfigMap: exactly one of secretKeyRef and configMapKeyRef."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                "valueFrom takes exactly one of secretKeyRef and configMapKeyRef",
            ),
        )
    )

    secret_key_ref: KeyReference | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyReference | None = Field(default=None, description="A key of a ConfigMap.")


class EnvVar(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(has(self.value) && has(self.valueFrom))", "an env entry takes value or valueFrom, not both"
            ),
            cel(
                f"!self.name.startsWith('{RESERVED_ENV_PREFIX}') "
                f"|| self.name.startsWith('{FAULT_ENV_PREFIX}')",
                f"{RESERVED_ENV_PREFIX}* variables are the operator's pod contract and are set by it "
                f"(only the test-only {FAULT_ENV_PREFIX}* knob is yours); choose another name",
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=ENV_NAME,
        description="The variable's name: letters, digits and _, not starting with a digit. LLMOP_* "
        "names are refused, except LLMOP_FAULT_*.",
    )
    value: str | None = Field(
        default=None, max_length=32768, description="The value; refused together with valueFrom."
    )
    value_from: EnvVarSource | None = None

    @field_validator("name")
    @classmethod
    def _not_contract(cls, name: str) -> str:  # the CEL rule's twin, for `llm-operator render`
        if name.startswith(RESERVED_ENV_PREFIX) and not name.startswith(FAULT_ENV_PREFIX):
            raise ValueError(f"{RESERVED_ENV_PREFIX}* variables are the operator's pod contract")
        return name


class NameReference(Spec):
    name: str = Field(
        min_length=1, max_length=253, description="The object's name, in the LLMDeployment's namespace."
    )
    optional: bool | None = Field(
        default=None,
        description="true: a missing object adds no variables. Unset or false: the container does "
        "not start without it.",
    )


class EnvFromSource(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.secretRef) != has(self.configMapRef)",
                "envFrom takes exactly one of secretRef and configMapRef",
            ),
        )
    )

    prefix: str | None = Field(
        default=None,
        max_length=128,
        pattern=ENV_NAME,
        description="Put before every key to make the variable's name.",
    )
    secret_ref: NameReference | None = Field(
        default=None, description="A Secret whose keys become variables (this or configMapRef)."
    )
    config_map_ref: NameReference | None = Field(
        default=None, description="A ConfigMap whose keys become variables (this or secretRef)."
    )


def _not_reserved(what: str) -> Rule:
    prefixes = " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES)
    return cel(
        f"self.all(k, {prefixes})",
        f"{what} under {' and '.join(RESERVED_LABEL_PREFIXES)} are set by the operator; use another prefix",
    )


# Serving pods mount the tokenizer like the engines: read-only from a claim. Nothing in a serving
# pod downloads, so an object-store or hub tokenizer would never be there.
TOKENIZER_URI_RULE = cel(
    f"self.matches('{PVC_URI}')",
    "runtime.tokenizerUri must be pvc://CLAIM/PATH: serving pods mount the tokenizer read-only "
    "from a claim and download nothing; copy it to a claim or leave it unset to use <engine>/tokenizer",
)


class RuntimeSpec(Spec):
    """How the serving pods run: image, tuning profile and overrides, timeouts, tokenizer, and the
    pod settings of the deployment's pods (env, pull secrets, service account, labels)."""

    image: str | None = Field(
        default=None,
        max_length=512,
        description="Serving image; defaults to the Triton TensorRT-LLM image of the deployment's "
        "release (status.release; docs/upgrading.md), or the CPU runtime image for the cpu-reference "
        "backend.",
    )
    profile: Profile = Field(
        default=Profile.BALANCED,
        description="Tuning preset for what runtime.batching, runtime.kvCache and "
        "runtime.chunkedContext leave unset: latency, balanced (default) or throughput "
        "(docs/runtime.md lists each one's values).",
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    kv_cache: KvCacheSpec = Field(default_factory=KvCacheSpec)
    chunked_context: bool | None = Field(
        default=None,
        description="Process long prompts in chunks over several steps, so engine.maxNumTokens may be "
        "below engine.maxInputLen. Unset: the profile's (off for latency, else on). Refused by the "
        "cpu-reference backend.",
    )
    streaming: bool = Field(
        default=True,
        description="Decoupled mode: tokens stream back as they are generated (requests with "
        "stream=true need it). Default true.",
    )
    exclude_input_in_output: bool = Field(
        default=True,
        description="Return only the generated text, without the prompt before it. Default true.",
    )
    tokenizer_uri: str | None = Field(
        default=None,
        max_length=1024,
        description="pvc://CLAIM/PATH of a Hugging Face tokenizer directory (tokenizer.json or "
        "tokenizer.model, with tokenizer_config.json) for pre/postprocessing, mounted read-only. "
        "Other schemes are refused. Unset: the model's own directory where the serving pods mount "
        "it, else <engine>/tokenizer, where engine builds copy the checkpoint's tokenizer "
        "(docs/runtime.md). The launcher refuses to start without a tokenizer there.",
        json_schema_extra=rules(TOKENIZER_URI_RULE),
    )
    exit_timeout_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="Seconds Triton drains in-flight requests on stop, 1-3600; default 30. The pod's "
        "termination grace period allows for it.",
    )
    stall_timeout_seconds: int = Field(
        default=60,
        ge=10,
        le=3600,
        description="Multi-node groups: seconds the leader's OpenAI front door waits for any response "
        "from Triton while requests are in flight before it takes the group as stalled (a frozen member "
        "hangs the others in their collectives while Triton stays live) and the whole group is "
        "recreated, 10-3600; default 60. Keep it above the longest gap between two responses: a "
        "prompt's prefill, or a whole generation where runtime.streaming is false. Single-pod "
        "replicas ignore it: the kubelet's liveness probe finds their frozen server.",
    )
    startup_timeout_seconds: int = Field(
        default=1200,
        ge=60,
        le=7200,
        description="Seconds model loading may take before the container is restarted (its startup "
        "probe), 60-7200; default 1200.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment of the serving container and the engine build (e.g. a "
        "Hugging Face token from a Secret). LLMOP_* names are reserved, except the CPU reference "
        "runtime's test-only fault knob LLMOP_FAULT_* (docs/development.md).",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets or ConfigMaps whose keys become environment variables, as envFrom.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (kubernetes.io/dockerconfigjson) to pull the images of the serving, "
        "engine-build and model-fetch pods with, at most 16.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="ServiceAccount of the serving, engine-build and model-fetch pods (e.g. for "
        "workload identity to an object store); its API token is not mounted. Unset: the "
        "namespace's default.",
    )
    pod_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra=rules(_not_reserved("labels")),
        description="Extra labels of the serving, engine-build and model-fetch pods, at most 32; keys "
        "under llmoperator.io/ and app.kubernetes.io/ are the operator's and are refused.",
    )
    pod_annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra=rules(_not_reserved("annotations")),
        description="Extra annotations of the serving, engine-build and model-fetch pods, at most 32; "
        "keys under llmoperator.io/ and app.kubernetes.io/ are the operator's and are refused.",
    )

    @field_validator("pod_labels", "pod_annotations")
    @classmethod
    def _not_reserved(cls, keys: dict[str, str]) -> dict[str, str]:  # the CEL rule's twin
        taken = [k for k in keys if k.startswith(RESERVED_LABEL_PREFIXES)]
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the operator; use another prefix")
        return keys

    @field_validator("tokenizer_uri")
    @classmethod
    def _tokenizer_on_a_claim(cls, uri: str | None) -> str | None:  # the CEL rule's twin
        if uri is not None and not re.fullmatch(PVC_URI, uri):
            raise ValueError(TOKENIZER_URI_RULE["message"])
        return uri

    def container_env(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """env and envFrom as a container takes them."""
        env = [e.model_dump(by_alias=True, exclude_none=True) for e in self.env]
        return env, [e.model_dump(by_alias=True, exclude_none=True) for e in self.env_from]

    def pod_identity(self) -> dict[str, Any]:
        """serviceAccountName and imagePullSecrets of a pod spec, where set."""
        identity: dict[str, Any] = {}
        if self.service_account_name:
            identity["serviceAccountName"] = self.service_account_name
        if self.image_pull_secrets:
            identity["imagePullSecrets"] = [{"name": s.name} for s in self.image_pull_secrets]
        return identity


# ---------------------------------------------------------------------------------------------
# spec.resources


class PoolPolicy(StrEnum):
    ORDERED = "ordered"  # fill pools in the listed order (first is preferred, later ones overflow)
    WEIGHTED = "weighted"  # divide replicas by integer weights


# Pool names that would collide with rollout objects: `<name>-b...` is the second slot's base name,
# `<name>-stable` / `<name>-canary` the revision Services.
RESERVED_POOL_NAMES = ("b", "stable", "canary")
RESERVED_POOL_MESSAGE = (
    "pool names b, b-*, stable and canary are reserved (the second rollout slot's objects and the "
    "revision Services are named <name>-b... and <name>-stable/-canary); choose another name"
)


class GpuPool(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                f"!(self.name in {list(RESERVED_POOL_NAMES)}) && !self.name.startsWith('b-')",
                RESERVED_POOL_MESSAGE,
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Short DNS label, unique among the pools, at most 20 characters; part of the "
        "pool's StatefulSet name. b, b-*, stable and canary are reserved.",
    )
    products: list[GpuProduct] = Field(
        min_length=1,
        max_length=16,
        description="The nvidia.com/gpu.product values (GPU Feature Discovery) this pool may use, best "
        "first, 1-16.",
    )
    weight: int = Field(
        default=1, ge=1, le=100, description="Share of replicas under the weighted policy, 1-100; default 1."
    )
    max_replicas: int | None = Field(
        default=None, ge=0, le=1000, description="Most replicas this pool takes, 0-1000. Unset: no cap."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:  # the CEL rule's twin, for `llm-operator render`
        if name in RESERVED_POOL_NAMES or name.startswith("b-"):
            raise ValueError(RESERVED_POOL_MESSAGE)
        return name


class GpuResources(Spec):
    """The GPU products the pods may use: one list (products) or several pools, not both. How many
    GPUs a pod gets comes from the plan (tensor x pipeline)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(has(self.products) && has(self.pools))",
                "set resources.gpu.products (one pool) or resources.gpu.pools, not both",
            ),
        )
    )

    products: list[GpuProduct] | None = Field(
        default=None,
        max_length=16,
        description="Allowed nvidia.com/gpu.product values (GPU Feature Discovery), best first, at "
        "most 16: one pool named main. Unset, and no pools: any product the usable nodes have. fp8 "
        "precisions refuse products older than Ada.",
    )
    min_memory_mib: int | None = Field(
        default=None,
        alias="minMemoryMiB",
        ge=1,
        description="Least memory per GPU, in MiB (GFD's nvidia.com/gpu.memory): products with less "
        "are not planned on, and pods require nodes with at least this much.",
    )
    pools: list[GpuPool] | None = Field(
        default=None,
        max_length=8,
        description="Up to 8 pools, each planned on its own (its own parallelism under 'auto', engine "
        "and StatefulSets), replicas divided by poolPolicy.",
    )
    pool_policy: PoolPolicy = Field(
        default=PoolPolicy.ORDERED,
        description="How replicas are divided among pools: ordered (default) fills them in the listed "
        "order, each up to its maxReplicas and capacity; weighted divides them by the pools' weights.",
    )


class ResourcesSpec(Spec):
    """What each serving pod gets: GPUs of the allowed products, CPU, memory and /dev/shm."""

    gpu: GpuResources = Field(default_factory=GpuResources)
    cpu: Quantity | None = Field(
        default=None, description="CPU request of each serving pod, a quantity (4, 500m). Unset: none."
    )
    memory: Quantity | None = Field(
        default=None,
        description="Memory request of each serving pod, a quantity (64Gi); its limit is this plus "
        "shmSize. Unset: neither.",
    )
    shm_size: Quantity = Field(
        default="16Gi",
        description="Size of /dev/shm (Triton's python backend, NCCL) in serving and engine-build pods, "
        "a quantity; default 16Gi. It is memory, charged to the pod.",
    )


# ---------------------------------------------------------------------------------------------
# spec.placement


class TensorParallelDomain(StrEnum):
    NVLINK = "nvlink"  # one node, or one nvidia.com/gpu.clique for multi-node NVLink
    NODE = "node"  # one node, even inside a clique


class PipelineParallelDomain(StrEnum):
    NETWORK_BLOCK = "network-block"
    ZONE = "zone"
    ANY = "any"


class Strictness(StrEnum):
    REQUIRED = "required"
    PREFERRED = "preferred"


class ReplicaSpread(StrEnum):
    ZONE = "zone"
    NODE = "node"
    NONE = "none"


class PlacementSpec(Spec):
    """Where the deployment's pods are scheduled (docs/placement.md)."""

    tensor_parallel_domain: TensorParallelDomain = Field(
        default=TensorParallelDomain.NVLINK,
        description="Where a replica's tensor-parallel ranks may sit: nvlink (default) inside one "
        "node, or across the nodes of one nvidia.com/gpu.clique on multi-node NVLink products (GB200 "
        "NVL72); node: inside one node always, so a replica larger than a node spans nodes by "
        "pipeline stages only, and a tensor parallelism no node holds fails planning "
        "(InsufficientGPUs).",
    )
    pipeline_parallel_domain: PipelineParallelDomain = Field(
        default=PipelineParallelDomain.NETWORK_BLOCK,
        description="What a replica's pods share when its pipeline stages span nodes: network-block "
        "(default; the zone where nodes carry no block label), zone, or any.",
    )
    pipeline_parallel_strictness: Strictness = Field(
        default=Strictness.REQUIRED,
        description="required (default): the stages' pods must share pipelineParallelDomain, or the "
        "plan fails; preferred: the scheduler prefers it.",
    )
    replica_spread: ReplicaSpread = Field(
        default=ReplicaSpread.ZONE,
        description="How replicas spread, as far as room allows: over zones (default), nodes, or not "
        "at all (none).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the serving, engine-build and model-fetch pods require; the planner "
        "counts only nodes that carry them.",
    )
    tolerations: list[PassThrough] = Field(
        default_factory=list,
        description="Tolerations (core/v1) of the serving, engine-build and model-fetch pods, besides "
        "the nvidia.com/gpu one the GPU pods get; the planner counts only nodes whose taints are "
        "tolerated.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="PriorityClass of the serving, engine-build and model-fetch pods. Unset: the "
        "cluster's default.",
    )


# ---------------------------------------------------------------------------------------------
# spec.autoscaling


class AutoscalingMetric(StrEnum):
    QUEUE_TO_COMPUTE_RATIO = "queue-to-compute-ratio"
    PENDING_REQUESTS = "pending-requests"
    QUEUE_TIME = "queue-time"
    KV_CACHE_UTILIZATION = "kv-cache-utilization"


class AutoscalingProvider(StrEnum):
    HPA = "hpa"
    KEDA = "keda"


# The scrape interval the idle window is held to: the chart's PodMonitor default
# (monitoring.podMonitor.interval) and prometheus-operator's. The idle window must span two of them,
# one for the sample that shows a request and one for a missed scrape, or requests that come and go
# between scrapes are never seen (docs/autoscaling.md, "Scale to zero").
SCRAPE_INTERVAL_SECONDS = 15
MIN_IDLE_SECONDS = 2 * SCRAPE_INTERVAL_SECONDS
# ext_proc's message_timeout in the router's Envoy (render/router/envoy.py): the picker answers a
# held request's body only when it lets the request go, so a hold may not outlast it.
MAX_HOLD_SECONDS = 900
# An unset hold is derived from the measured cold start (render/scale_to_zero.py derived_hold): this
# factor of it, rounded up to the step, at least the default (the fixed default of earlier versions,
# and the hold before a cold start is measured) and at most the ceiling.
DEFAULT_HOLD_SECONDS = 300
HOLD_COLD_START_FACTOR = 1.5
HOLD_STEP_SECONDS = 60
HOLD_MESSAGE = (
    "autoscaling.scaleToZero.holdSeconds must be at least 1: it is how long the router holds a request "
    "while no replica is ready, and 0 would refuse every request that arrives at zero replicas; set it "
    "above the time a replica takes to start, or leave it out to have it derived from the measured "
    "cold start"
)
IDLE_MESSAGE = (
    f"autoscaling.scaleToZero.idleSeconds must be at least {MIN_IDLE_SECONDS}: two scrape intervals of "
    f"{SCRAPE_INTERVAL_SECONDS} s (the chart's monitoring.podMonitor.interval), or requests that start and "
    "end between two scrapes are never seen and the deployment scales to zero under them; set "
    f"idleSeconds to {MIN_IDLE_SECONDS} or more (twice your scrape interval if it is longer)"
)
ZERO_NEEDS_KEDA = (
    "autoscaling.minReplicas 0 needs autoscaling.provider keda: an HPA cannot scale to zero (Kubernetes' "
    "HPAScaleToZero feature gate is alpha and needs an Object or External metric), and the operator "
    "renders none that does; set provider: keda, or minReplicas 1 or more"
)
ZERO_NEEDS_POOL = (
    "autoscaling.minReplicas 0 needs routing.mode inference-pool: with no replica running, only the "
    "router's endpoint picker can hold a request until the first replica is ready (in routing.mode "
    "service clients would be refused); set routing.mode: inference-pool, or minReplicas 1 or more"
)


class ScaleToZeroSpec(Spec):
    """How a deployment with autoscaling.minReplicas 0 goes to zero and wakes up: the router's endpoint
    picker holds requests while no replica is ready, and they wake it (docs/autoscaling.md, "Scale to
    zero"). Only with minReplicas 0; there, absent means every default."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel("!has(self.holdSeconds) || self.holdSeconds >= 1", HOLD_MESSAGE),
            cel(f"self.idleSeconds >= {MIN_IDLE_SECONDS}", IDLE_MESSAGE),
        )
    )

    idle_seconds: int = Field(
        default=300,
        le=86400,
        description=f"Seconds without a request held, queued or running before the deployment scales "
        f"to zero, {MIN_IDLE_SECONDS}-86400; default 300 (KEDA's cooldownPeriod, and its "
        "initialCooldownPeriod for a new deployment).",
    )
    hold_seconds: int | None = Field(
        default=None,
        le=MAX_HOLD_SECONDS,
        description=f"Seconds the router holds a request while no replica can take it (at zero: until "
        f"the first replica is Ready), 1-{MAX_HOLD_SECONDS}. Past it the client gets a 503 in OpenAI's "
        "error format with Retry-After. Unset: derived from the measured cold start "
        f"(status.lastColdStart): {HOLD_COLD_START_FACTOR:g} times it rounded up to a multiple of "
        f"{HOLD_STEP_SECONDS} s, at least {DEFAULT_HOLD_SECONDS} "
        f"(also before one is measured) and at most {MAX_HOLD_SECONDS}; it changes only at zero replicas, "
        'and only upwards: set this field for a shorter hold (docs/autoscaling.md, "The hold\'s default").',
    )
    max_held_requests: int = Field(
        default=1000,
        ge=1,
        le=10000,
        description="Requests the router holds at once, 1-10000; default 1000. One more is refused "
        "at once with a 429 in OpenAI's error format with Retry-After.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScaleToZeroSpec:  # the CEL rules' twins, for `llm-operator render`
        if self.hold_seconds is not None and self.hold_seconds < 1:
            raise ValueError(HOLD_MESSAGE)
        if self.idle_seconds < MIN_IDLE_SECONDS:
            raise ValueError(IDLE_MESSAGE)
        return self


class AutoscalingSpec(Spec):
    """An autoscaler (HPA or KEDA) that sets spec.replicas from a per-pod serving metric
    (docs/autoscaling.md). Unset: nothing changes spec.replicas but you."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
            ),
            cel("self.minReplicas >= 1 || self.provider == 'keda'", ZERO_NEEDS_KEDA),
            cel(
                "self.minReplicas == 0 || !has(self.scaleToZero)",
                "autoscaling.scaleToZero applies only with autoscaling.minReplicas 0: set minReplicas: 0, "
                "or remove scaleToZero",
            ),
        )
    )

    provider: AutoscalingProvider = Field(
        default=AutoscalingProvider.HPA,
        description="hpa: an autoscaling/v2 HorizontalPodAutoscaler on a custom metric served by "
        "prometheus-adapter. keda: a KEDA ScaledObject with a prometheus trigger (KEDA must be "
        "installed; the operator's Prometheus URL is LLMOP_PROMETHEUS_URL).",
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas, 0-1000; default 1. At most maxReplicas. 0 (scale to zero) needs "
        "provider keda and routing.mode inference-pool: see scaleToZero.",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas, 1-1000.")
    metric: AutoscalingMetric = Field(
        default=AutoscalingMetric.QUEUE_TO_COMPUTE_RATIO,
        description="queue-to-compute-ratio (default), pending-requests, queue-time or kv-cache-utilization.",
    )
    target: Quantity = Field(
        default="1",
        description="Average value per serving pod, a quantity ('4', '800m'); default '1', e.g. for "
        "the ratio.",
    )
    behavior: PassThrough | None = Field(
        default=None,
        description="autoscaling/v2 HorizontalPodAutoscalerBehavior, passed through (keda: to "
        "advanced.horizontalPodAutoscalerConfig.behavior).",
    )
    scale_to_zero: ScaleToZeroSpec | None = Field(
        default=None,
        description="Absent: the defaults below.",
    )

    @model_validator(mode="after")
    def _zero(self) -> AutoscalingSpec:  # the CEL rules' twins, for `llm-operator render`
        if self.min_replicas == 0 and self.provider != AutoscalingProvider.KEDA:
            raise ValueError(ZERO_NEEDS_KEDA)
        if self.min_replicas > 0 and self.scale_to_zero is not None:
            raise ValueError("autoscaling.scaleToZero applies only with autoscaling.minReplicas 0")
        return self

    @property
    def zero(self) -> ScaleToZeroSpec | None:
        """What scaling to zero uses (the defaults where scaleToZero is absent); None above zero."""
        if self.min_replicas > 0:
            return None
        return self.scale_to_zero or ScaleToZeroSpec()


# ---------------------------------------------------------------------------------------------
# spec.rollout


class RolloutStrategy(StrEnum):
    ROLLING = "rolling"
    CANARY = "canary"


class TrafficRouting(StrEnum):
    GATEWAY_API = "gateway-api"
    REPLICA_RATIO = "replica-ratio"


class CanaryStep(Spec):
    weight: int = Field(
        ge=1, le=100, description="Percent of traffic sent to the canary, 1-100; above the previous step's."
    )
    pause_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="Seconds the step holds once its weight is in effect, 0-86400. Absent: the rollout "
        "pauses at this step until promoted (annotation llmoperator.io/rollout-action=promote).",
    )


class PrometheusAnalysis(Spec):
    url: str = Field(
        max_length=1024,
        pattern=r"^https?://",
        description="Base URL (http:// or https://) of the Prometheus to query; it must be one of the "
        "operator's allowed analysis endpoints (chart value operator.analysisPrometheusUrls), else "
        "the deployment is Stalled (AnalysisEndpointNotAllowed).",
    )


ANALYSIS_BOUNDS = (
    "maxErrorRatePercent",
    "maxP99LatencyMilliseconds",
    "maxTimeToFirstTokenMilliseconds",
    "maxMeanQueueTimeMilliseconds",
)
MAX_MILLISECONDS = 3_600_000
ANALYSIS_BOUND_MESSAGE = (
    "rollout.canary.analysis needs at least one bound to check: set "
    + ", ".join(ANALYSIS_BOUNDS[:-1])
    + f" or {ANALYSIS_BOUNDS[-1]}"
)


class CanaryAnalysis(Spec):
    """Argo Rollouts' background analysis over the canary revision's own Triton metrics; at least
    one max* bound is required."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(" || ".join(f"has(self.{b})" for b in ANALYSIS_BOUNDS), ANALYSIS_BOUND_MESSAGE),
        )
    )

    prometheus: PrometheusAnalysis = Field(description="Where the canary's metrics are queried.")
    interval_seconds: int = Field(
        default=60,
        ge=10,
        le=3600,
        description="Seconds between measurements, 10-3600; default 60. One measurement of every "
        "metric per interval, over a window of the same length.",
    )
    initial_delay_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Seconds to wait after the first step's weight takes effect before the first "
        "window starts, 0-3600; default 0.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description="A window in which the canary answered fewer requests is Inconclusive, never "
        "Successful: no traffic never promotes. Default 20.",
    )
    failure_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="The analysis fails (abort) when failed windows exceed this, 0-100; default 0.",
    )
    inconclusive_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description="The rollout pauses (until promoted) when inconclusive windows exceed this, "
        "0-100; default 0.",
    )
    consecutive_error_limit: int = Field(
        default=4,
        ge=0,
        le=100,
        description="The analysis errs (abort) when more queries than this fail in a row "
        "(Prometheus unreachable or a bad answer), 0-100; default 4.",
    )
    max_error_rate_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="A window fails when the canary's error rate, in percent, is above this (0-100).",
    )
    max_p99_latency_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MILLISECONDS,
        description="A window fails when the canary's p99 request latency, in milliseconds, is above this.",
    )
    max_time_to_first_token_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MILLISECONDS,
        description="A window fails when the canary's p99 time to first token, in milliseconds, is "
        "above this (checked as the share of first responses within a histogram bucket edge "
        "rendered at this budget).",
    )
    max_mean_queue_time_milliseconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MILLISECONDS,
        description="A window fails when the canary's mean time in Triton's queue, in milliseconds, "
        "is above this.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> CanaryAnalysis:  # the CEL rule's twin: the first CRD took none
        if all(getattr(self, to_snake(b)) is None for b in ANALYSIS_BOUNDS):
            raise ValueError(ANALYSIS_BOUND_MESSAGE)
        return self


# Gateway API names: ParentReference.name / sectionName and a namespace.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class GatewayParentRef(Spec):
    """A Gateway the HTTPRoute attaches to (Gateway API ParentReference, kind Gateway)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="The Gateway's name.")
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="Defaults to the LLMDeployment's namespace.",
    )
    section_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="A listener of the Gateway; all of them when absent.",
    )


class GatewayRouting(Spec):
    parent_refs: list[GatewayParentRef] = Field(
        min_length=1, max_length=8, description="The Gateways the HTTPRoute attaches to, 1-8."
    )


class CanarySpec(Spec):
    """The canary's steps, how its traffic is split, and its optional analysis (docs/rollouts.md)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.steps.map(s, s.weight).isSorted() && "
                "self.steps.all(s, self.steps.exists_one(t, t.weight == s.weight))",
                "rollout.canary.steps weights must increase strictly and stay <= 100, e.g. 10, 50, 100",
            ),
            cel(
                "self.trafficRouting != 'gateway-api' || has(self.gateway)",
                "rollout.canary.gateway.parentRefs is required with trafficRouting gateway-api: name "
                "the Gateway the deployment's HTTPRoute attaches to",
            ),
            cel(
                "self.trafficRouting == 'gateway-api' || !has(self.gateway)",
                "rollout.canary.gateway is used only with trafficRouting gateway-api: remove it, or set "
                "trafficRouting: gateway-api",
            ),
        )
    )

    steps: list[CanaryStep] = Field(
        min_length=1,
        max_length=20,
        description="1-20 steps the canary goes through, weights strictly increasing up to 100; after "
        "the last it is promoted.",
    )
    traffic_routing: TrafficRouting = Field(
        default=TrafficRouting.REPLICA_RATIO,
        description="replica-ratio: one client Service over both revisions, the canary's share of "
        "ready replicas is its weight. gateway-api: an HTTPRoute with weighted backends per revision.",
    )
    gateway: GatewayRouting | None = Field(
        default=None,
        description="Required with trafficRouting gateway-api, refused otherwise.",
    )
    scale_down_delay_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="gateway-api: how long the revision a promotion replaced keeps its pods (without "
        "traffic), so a gateway that has not loaded the new route yet still reaches live pods (Argo "
        "Rollouts' scaleDownDelaySeconds); 0-3600, default 30. replica-ratio removes it at once: its "
        "pods leave the client Service as they stop.",
    )
    abort_scale_down_delay_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="gateway-api: how long an aborted canary keeps its pods (without traffic) before "
        "it is scaled to 0; 0-3600, default 30. replica-ratio takes an aborted canary's traffic away "
        "by scaling it to 0 at once.",
    )
    progress_deadline_seconds: int = Field(
        default=1800,
        ge=10,
        le=86400,
        description="How long a step, or the promotion, may wait for its weight once the canary's "
        "workloads exist: canary replicas not ready by then (a crash loop, an image that cannot be "
        "pulled, no room for their pods) abort the rollout as failed analysis does, and the stable "
        "serves all traffic. An engine build for the canary does not count. 10-86400; the default, "
        "1800, allows for loading a large engine.",
    )
    analysis: CanaryAnalysis | None = Field(
        default=None,
        description="Without analysis, steps advance on their pauses alone.",
    )


class RolloutSpec(Spec):
    """How a changed spec (a new revision) replaces the one serving (docs/api.md, Canary rollouts)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.strategy != 'canary' || has(self.canary)",
                "rollout.canary is required when rollout.strategy is canary",
            ),
        )
    )

    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.ROLLING,
        description="rolling (default): every change rolls out to all replicas. canary: a new revision "
        "serves beside the stable one, step by step (rollout.canary is then required).",
    )
    canary: CanarySpec | None = None


# ---------------------------------------------------------------------------------------------
# spec.networkPolicy


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(Spec):
    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                "a matchExpressions entry takes values with In and NotIn, and none with Exists and "
                "DoesNotExist",
            ),
        )
    )

    key: str = Field(min_length=1, max_length=317, description="The label's key.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        max_length=64,
        description="The values In and NotIn compare the label with (at least one); none with Exists "
        "and DoesNotExist.",
    )


class LabelSelector(Spec):
    """A label selector (metav1.LabelSelector): every matchLabels entry and matchExpressions
    requirement must hold."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=32, description="Labels that must be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=32, description="Requirements on the labels."
    )


# An IPv4 or IPv6 CIDR; the pydantic validator below checks it exactly (the API server's CEL CIDR
# functions need Kubernetes 1.31, the chart supports 1.29).
CIDR_PATTERN = r"^[0-9a-fA-F.:]+/[0-9]{1,3}$"


class NetworkPolicySpec(Spec):
    """The NetworkPolicy the operator applies to the serving pods. Editing it restarts no pod."""

    enabled: bool = Field(
        default=True,
        description="A NetworkPolicy admits to the serving pods only the client ports (Triton's "
        "HTTP 8000 and gRPC 8001, the OpenAI API 8080) from the clients below, Triton's metrics "
        "port (8002) from the monitoring peers the operator is configured with, and any port "
        "between the deployment's multi-node pods (the launch agent on 2222, MPI, NCCL). false: no "
        "NetworkPolicy, every port is open to whatever can reach the pods. Enforced only where the "
        "cluster's network plugin implements NetworkPolicy.",
    )
    client_namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces whose pods may reach the client ports, besides the LLMDeployment's "
        "own namespace (always admitted). Absent: only its own namespace. {} selects every "
        "namespace (pods only: a gateway or load balancer outside the pod network needs "
        "clientCIDRs).",
    )
    client_cidrs: list[Annotated[str, Field(max_length=43, pattern=CIDR_PATTERN)]] = Field(
        default_factory=list,
        alias="clientCIDRs",
        max_length=32,
        description="Addresses that may reach the client ports (NetworkPolicy ipBlocks): a gateway, "
        "ingress or load balancer outside the pod network. [0.0.0.0/0, ::/0] admits any source, "
        "which was the default before clients were limited to the namespace.",
    )

    @field_validator("client_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            try:
                ipaddress.ip_network(cidr)
            except ValueError as e:
                raise ValueError(
                    f"networkPolicy.clientCIDRs: {cidr} is not a CIDR such as 192.0.2.0/24 ({e})"
                ) from None
        return cidrs

    @property
    def limits_clients(self) -> bool:
        """Whether the spec names its clients (else a policy that admitted any source before
        clients were limited keeps doing so: render/network.py)."""
        return self.client_namespace_selector is not None or bool(self.client_cidrs)


# ---------------------------------------------------------------------------------------------
# spec.routing


class RoutingMode(StrEnum):
    SERVICE = "service"
    INFERENCE_POOL = "inference-pool"


# InferencePool v1's endpointPickerRef.failureMode (GIE api/v1/inferencepool_types.go).
class FailureMode(StrEnum):
    FAIL_CLOSE = "FailClose"
    FAIL_OPEN = "FailOpen"


class PickerSpec(Spec):
    """The router's endpoint picker; only with routing.mode inference-pool."""

    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_CLOSE,
        description="What the router does while the endpoint picker cannot answer. FailClose (the "
        "InferencePool default): the request fails with a 5xx. FailOpen: it goes to the client "
        "Service, which picks a ready replica at random, as routing.mode service does.",
    )
    gateway_namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces whose pods (a gateway that routes to the InferencePool, such as "
        "Istio's) may reach the endpoint picker's ext_proc port 9002; they then also need the "
        "client ports (networkPolicy.clientNamespaceSelector). Absent: only the router's own Envoy "
        "asks the picker.",
    )


class TritonPorts(StrEnum):
    CLOSED = "Closed"
    OPEN = "Open"


class ApiKeysSpec(Spec):
    secret_ref: LocalObjectReference = Field(
        description="A Secret in the LLMDeployment's namespace: each of its keys holds one accepted "
        "API key (several keys: rotate by adding the new one, moving clients, then removing the old). "
        "The front door reads it from a volume and follows changes without a restart (about a minute "
        "for the kubelet to update the volume); the operator never reads it."
    )
    triton_ports: TritonPorts = Field(
        default=TritonPorts.CLOSED,
        description="Closed: the NetworkPolicy admits clients to the OpenAI port (8080) only, so "
        "nothing bypasses the key through Triton's own HTTP (8000) and gRPC (8001) APIs, which have "
        "none. Open: they stay open to the clients networkPolicy admits (they ask for no key).",
    )


class RoutingSpec(Spec):
    """How clients reach the replicas (docs/routing.md)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "self.mode == 'inference-pool' || !has(self.picker)",
                "routing.picker is used only with routing.mode inference-pool: remove it, or set "
                "mode: inference-pool",
            ),
        )
    )

    mode: RoutingMode = Field(
        default=RoutingMode.SERVICE,
        description="service: clients reach the leaders through the client Service (kube-proxy "
        "picks one at random). inference-pool: an InferencePool of the leaders and a router "
        "(`<name>-router`: Envoy and the Gateway API Inference Extension's endpoint picker) that "
        "sends each OpenAI request to the replica with the shortest queue and KV-cache use; a "
        "gateway that supports InferencePool can route to the pool instead (docs/routing.md).",
    )
    picker: PickerSpec | None = None
    api_keys: ApiKeysSpec | None = Field(
        default=None,
        description="Require an API key on the OpenAI port (`Authorization: Bearer KEY`, the openai "
        "SDK's api_key): requests without an accepted one get 401 in OpenAI's error format. The "
        "router passes the header through. Unset: no key is checked (put an authenticating gateway "
        "in front, docs/serving-api.md).",
    )

    @model_validator(mode="after")
    def _picker_with_pool(self) -> RoutingSpec:  # the CEL rule's twin, for `llm-operator render`
        if self.picker is not None and self.mode != RoutingMode.INFERENCE_POOL:
            raise ValueError("routing.picker is used only with routing.mode inference-pool")
        return self

    @property
    def failure_mode(self) -> FailureMode:
        return self.picker.failure_mode if self.picker is not None else FailureMode.FAIL_CLOSE


# ---------------------------------------------------------------------------------------------
# spec


class LLMDeploymentSpec(Spec):
    """One served LLM: the model and where it comes from, how it is built and served, on which GPUs
    and nodes, how many replicas, how changes roll out, and who may reach it. Cross-field rules are
    checked at admission, each with a message naming the fix."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            cel(
                "!(self.engine.precision in ['fp8', 'w4a8-awq'] || self.engine.kvCacheDtype == 'fp8') "
                "|| !has(self.resources) || !has(self.resources.gpu) "
                "|| !has(self.resources.gpu.products) "
                f"|| self.resources.gpu.products.all(p, !p.matches('{PRE_ADA_PRODUCT_REGEX}'))",
                "fp8 (weights or KV cache) requires an Ada/Hopper-or-newer GPU product; remove "
                "Ampere/Turing/Volta products (A100, A10G, T4, ...) from resources.gpu.products",
            ),
            cel(
                "!(self.engine.precision in ['fp8', 'w4a8-awq'] || self.engine.kvCacheDtype == 'fp8') "
                "|| !has(self.resources) || !has(self.resources.gpu) "
                "|| !has(self.resources.gpu.pools) "
                "|| self.resources.gpu.pools.all(pool, pool.products.all(p, "
                f"!p.matches('{PRE_ADA_PRODUCT_REGEX}')))",
                "fp8 (weights or KV cache) requires Ada/Hopper-or-newer GPU products in every pool",
            ),
            cel(
                "!has(self.model.architecture) || type(self.parallelism.tensor) == string "
                "|| self.model.architecture.numAttentionHeads % self.parallelism.tensor == 0",
                "parallelism.tensor must divide model.architecture.numAttentionHeads",
            ),
            cel(
                "!has(self.model.architecture) || type(self.parallelism.pipeline) == string "
                "|| self.model.architecture.numLayers % self.parallelism.pipeline == 0",
                "parallelism.pipeline must divide model.architecture.numLayers",
            ),
            cel(
                "self.engine.backend != 'cpu-reference' || (self.parallelism.tensor == 1 "
                "&& (self.parallelism.pipeline == 1 || (has(self.engine.cpuReference) "
                "&& self.engine.cpuReference.contract == 'pytorch')))",
                "the cpu-reference backend runs on CPU: parallelism.tensor must be 1, and "
                "parallelism.pipeline 1 unless engine.cpuReference.contract is pytorch (which splits "
                "the model's layers into pipeline stages, one pod each)",
            ),
            cel(
                f"self.engine.backend != 'cpu-reference' || self.model.source.uri in {BUILTIN_URIS} "
                "|| self.model.source.uri.matches('^(s3|hf|pvc)://')",
                f"the cpu-reference backend serves its builtin models ({' or '.join(BUILTIN_URIS)}) "
                "or a checkpoint in its format from s3://, hf:// or pvc://: set model.source.uri to "
                "one of those",
            ),
            cel(
                "self.engine.backend == 'cpu-reference' || !self.model.source.uri.startsWith('builtin://')",
                "builtin:// models exist only in the cpu-reference backend; point model.source.uri "
                "at s3://, pvc:// or hf://",
            ),
            cel(
                "self.engine.backend != 'pytorch' || !has(self.runtime) || ((!has(self.runtime.batching) "
                "|| (!has(self.runtime.batching.strategy) "
                "&& !has(self.runtime.batching.maxQueueDelayMicroseconds) "
                "&& !has(self.runtime.batching.maxQueueSize) "
                "&& !has(self.runtime.batching.schedulerPolicy))) "
                "&& (!has(self.runtime.kvCache) || !has(self.runtime.kvCache.hostMemoryBytes)))",
                "the pytorch backend batches and queues inside TensorRT-LLM's LLM API, which the operator "
                "configures with maxBatchSize, maxNumTokens, runtime.chunkedContext and runtime.kvCache "
                "(freeGpuMemoryPercent, maxTokens, blockReuse) only: remove runtime.batching and "
                "runtime.kvCache.hostMemoryBytes" + KEEP_ENGINES,
            ),
            cel(
                "self.engine.backend != 'cpu-reference' || !has(self.runtime) "
                "|| ((!has(self.runtime.kvCache) "
                "|| (!has(self.runtime.kvCache.freeGpuMemoryPercent) "
                "&& !has(self.runtime.kvCache.maxTokens) "
                "&& !has(self.runtime.kvCache.blockReuse) "
                "&& !has(self.runtime.kvCache.hostMemoryBytes))) "
                "&& !has(self.runtime.chunkedContext) "
                "&& (!has(self.runtime.batching) || (!has(self.runtime.batching.strategy) "
                "&& !has(self.runtime.batching.schedulerPolicy))))",
                "the cpu-reference backend decodes each batch whole and has no KV-cache pool, so it takes "
                "runtime.batching.maxQueueDelayMicroseconds and .maxQueueSize only: remove "
                "runtime.batching.strategy, .schedulerPolicy, runtime.kvCache and runtime.chunkedContext",
            ),
            cel(
                "(has(self.runtime) && has(self.runtime.chunkedContext) && self.runtime.chunkedContext) "
                "|| self.engine.maxNumTokens >= self.engine.maxInputLen",
                "engine.maxNumTokens must be >= engine.maxInputLen unless runtime.chunkedContext is "
                "true (a whole prompt must fit one batch)",
            ),
            cel(
                "!has(self.autoscaling) || self.autoscaling.minReplicas >= 1 "
                "|| (has(self.routing) && self.routing.mode == 'inference-pool')",
                ZERO_NEEDS_POOL,
            ),
            cel(
                "!has(self.routing) || self.routing.mode != 'inference-pool' "
                "|| !has(self.rollout.canary) || self.rollout.canary.trafficRouting != 'gateway-api'",
                "rollout.canary.trafficRouting gateway-api splits traffic with an HTTPRoute over the "
                "client Service, which routing.mode inference-pool bypasses: use trafficRouting "
                "replica-ratio (the picker then sends the canary its share of ready replicas), or "
                "routing.mode service",
            ),
        )
    )

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas to serve, each of tensor x pipeline GPUs, 0-1000; default 1. The scale "
        "subresource's field: kubectl scale and spec.autoscaling set it.",
    )
    autoscaling: AutoscalingSpec | None = None
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)

    @model_validator(mode="after")
    def _canary_routing(self) -> LLMDeploymentSpec:  # the CEL rules' twins, for `llm-operator render`
        canary = self.rollout.canary
        pool = self.routing.mode == RoutingMode.INFERENCE_POOL
        if self.autoscaling is not None and self.autoscaling.min_replicas == 0 and not pool:
            raise ValueError(ZERO_NEEDS_POOL)
        if pool and canary is not None and canary.traffic_routing == TrafficRouting.GATEWAY_API:
            raise ValueError(
                "rollout.canary.trafficRouting gateway-api cannot be used with routing.mode "
                "inference-pool: use trafficRouting replica-ratio, or routing.mode service"
            )
        return self


# ---------------------------------------------------------------------------------------------
# status (written by the operator only)


class Condition(Spec):
    """A condition (metav1.Condition)."""

    type: str = Field(description="The condition's type, e.g. Ready or Stalled.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the status.")
    message: str = Field(default="", description="Human-readable detail; may be empty.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the condition was set for."
    )
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed (RFC 3339)."
    )


# One of the two sets of serving objects: a keeps the plain names, b adds "-b". A revision never
# moves slot, so promotion restarts no pod.
class Slot(StrEnum):
    A = "a"
    B = "b"


class RolloutPhase(StrEnum):
    STABLE = "Stable"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    PROMOTING = "Promoting"
    ABORTED = "Aborted"


class PausedReason(StrEnum):
    UNTIL_PROMOTED = "UntilPromoted"  # a step without pauseSeconds
    INCONCLUSIVE = "Inconclusive"  # the analysis could not tell: a person decides


class AnalysisPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCESSFUL = "Successful"
    INCONCLUSIVE = "Inconclusive"
    FAILED = "Failed"
    ERROR = "Error"


class AnalysisMetric(StrEnum):
    ERROR_RATE = "errorRate"
    P99_LATENCY = "p99Latency"
    TIME_TO_FIRST_TOKEN = "timeToFirstToken"
    MEAN_QUEUE_TIME = "meanQueueTime"


class MetricStatus(Spec):
    """Counters of one metric over the analysis run, with Argo Rollouts' semantics."""

    name: AnalysisMetric = Field(description="errorRate, p99Latency, timeToFirstToken or meanQueueTime.")
    successful: int = Field(default=0, description="Successful windows.")
    failed: int = Field(default=0, description="Failed windows.")
    inconclusive: int = Field(default=0, description="Inconclusive windows.")
    errors: int = Field(default=0, description="Failed queries (Prometheus unreachable or a bad answer).")
    consecutive_errors: int = Field(default=0, description="Queries that failed in a row, up to now.")
    step_successful: int = Field(
        default=0, description="Successful windows since the current step's weight took effect."
    )
    last_value: float | None = Field(default=None, description="errorRate in percent, the others in ms.")
    last_phase: AnalysisPhase | None = Field(default=None, description="The last measurement's result.")
    last_message: str | None = Field(default=None, description="The last measurement in words.")
    last_at: datetime | None = Field(default=None, description="When the last measurement was taken.")


class AnalysisStatus(Spec):
    """The canary analysis of the current rollout."""

    phase: AnalysisPhase = Field(
        default=AnalysisPhase.PENDING,
        description="Pending, Running, Successful, Inconclusive, Failed or Error.",
    )
    started_at: datetime | None = Field(default=None, description="When the analysis started.")
    next_measurement_at: datetime | None = Field(default=None, description="When the next window ends.")
    metrics: list[MetricStatus] = Field(
        default_factory=list, description="One entry per bound set in rollout.canary.analysis."
    )


# rollout/machine.py writes it.
class RevisionsStatus(Spec):
    """Which revision serves in which slot and where a canary rollout stands. All of the rollout's
    state is here, its timers included, so a restarted operator resumes in place."""

    stable: str | None = Field(
        default=None,
        description="The stable revision: 10 hex characters, a hash of what the serving pods run "
        "(docs/api.md, Canary rollouts).",
    )
    stable_slot: Slot | None = Field(
        default=None,
        description="The stable revision's slot: a (the plain object names) or b (names with -b).",
    )
    canary: str | None = Field(default=None, description="The canary revision, while there is one.")
    canary_slot: Slot | None = Field(default=None, description="The canary's slot, the other one.")
    canary_step: int | None = Field(default=None, description="Index into rollout.canary.steps.")
    canary_weight: int | None = Field(
        default=None,
        description="Percent of traffic the canary actually gets: its share of ready replicas "
        "(replica-ratio) or its HTTPRoute weight (gateway-api).",
    )
    stable_replicas: int | None = Field(default=None, description="Replicas of the stable revision.")
    stable_ready_replicas: int | None = Field(
        default=None, description="Ready replicas of the stable revision."
    )
    canary_replicas: int | None = Field(default=None, description="Replicas of the canary revision.")
    canary_ready_replicas: int | None = Field(
        default=None, description="Ready replicas of the canary revision."
    )
    phase: RolloutPhase | None = Field(
        default=None, description="Stable, Progressing, Paused, Promoting or Aborted."
    )
    message: str | None = Field(default=None, description="Where the rollout stands, in words.")
    step_started_at: datetime | None = Field(
        default=None, description="When the current step's weight took effect (its pause timer)."
    )
    waiting_since: datetime | None = Field(
        default=None,
        description="When the current step (or the promotion) began waiting for its weight with the "
        "canary's workloads in place: rollout.canary.progressDeadlineSeconds counts from here.",
    )
    paused_reason: PausedReason | None = Field(
        default=None,
        description="Why the rollout is Paused: UntilPromoted (a step without pauseSeconds) or "
        "Inconclusive (the analysis could not tell: a person decides).",
    )
    aborted_at: datetime | None = Field(default=None, description="When the canary was aborted.")
    abort_reason: str | None = Field(
        default=None,
        description="Why the canary was aborted, e.g. the analysis bound it broke, or its pods that did "
        "not get ready in time.",
    )
    scale_down_at: datetime | None = Field(
        default=None,
        description="gateway-api, after a promotion: when the previous stable revision's slot is "
        "removed (rollout.canary.scaleDownDelaySeconds after the promotion).",
    )
    last_action: str | None = Field(
        default=None, description="The last llmoperator.io/rollout-action value handled (once each)."
    )
    analysis: AnalysisStatus | None = None


class PoolPlacementStatus(Spec):
    name: str = Field(description="The pool's name.")
    gpu_product: str = Field(description="The GPU product the pool's plan chose.")
    replicas: int = Field(description="Replicas planned in the pool.")
    ready_replicas: int = Field(default=0, description="Ready replicas of the pool.")


class PlacementStatus(Spec):
    """The planner's plan (docs/placement.md), of the first pool where there are several."""

    gpu_product: str | None = Field(default=None, description="The chosen nvidia.com/gpu.product.")
    tensor_parallelism: int | None = Field(default=None, description="Tensor parallelism (GPUs per layer).")
    pipeline_parallelism: int | None = Field(default=None, description="Pipeline stages.")
    gpus_per_replica: int | None = Field(default=None, description="GPUs of one replica (0 on CPU).")
    gpus_per_pod: int | None = Field(default=None, description="GPUs each pod requests (0 on CPU).")
    pods_per_replica: int | None = Field(
        default=None, description="Pods of one replica: 1, or a multi-node group."
    )
    reason: str | None = Field(default=None, description="Why this plan, in one sentence.")
    warnings: list[str] | None = Field(
        default=None,
        description="Where the plan falls short of the spec (KV cache below the batch limits, "
        "memory not checked, more replicas than the nodes hold); posted as PlacementWarning Events.",
    )
    pools: list[PoolPlacementStatus] | None = Field(
        default=None, description="How replicas are split among pools, where there are several."
    )


class EngineStatus(Spec):
    """The engines of the first pool, for backends that build them."""

    cache_key: str | None = Field(default=None, description="The engine's cache key.")
    ready: bool | None = Field(default=None, description="Whether the engines exist.")
    uri: str | None = Field(default=None, description="Where the engines are.")
    build_job: str | None = Field(default=None, description="The engine-build Job, once one was created.")


class ModelStatus(Spec):
    """The model in the cache (s3:// and hf:// sources): what was fetched, and how far a fetch is."""

    cache_key: str | None = Field(default=None, description="The fetch key (llm-model-cache-index).")
    directory: str | None = Field(
        default=None, description="models/<source key>/<resolved revision> inside model.cache's claim."
    )
    resolved_revision: str | None = Field(
        default=None, description="hf://: the commit; s3://: etags-<digest of the objects' ETags>."
    )
    bytes_fetched: int | None = Field(default=None, description="Bytes fetched so far.")
    bytes_total: int | None = Field(default=None, description="Bytes of the whole model.")
    files_fetched: int | None = Field(default=None, description="Files fetched so far.")
    files_total: int | None = Field(default=None, description="Files of the whole model.")


class EndpointsStatus(Spec):
    """In-cluster addresses of the client Service `<name>` (docs/serving-api.md)."""

    http: str | None = Field(default=None, description="Triton's HTTP API (port 8000).")
    grpc: str | None = Field(default=None, description="Triton's gRPC API (port 8001).")
    metrics: str | None = Field(default=None, description="Triton's Prometheus metrics (port 8002).")
    openai: str | None = Field(
        default=None,
        description="Base URL of the OpenAI-compatible API (http://SERVICE.NAMESPACE.svc:8080/v1; with "
        "routing.mode inference-pool, the router <name>-router's): what an OpenAI client's base_url "
        "takes.",
    )


class ReleaseStatus(Spec):
    """The Triton + TensorRT-LLM release the deployment runs (docs/upgrading.md)."""

    tensorrt_llm_version: str | None = Field(
        default=None,
        description="The TensorRT-LLM version recorded on the deployment (annotation "
        "llmoperator.io/tensorrt-llm-version) when it was first reconciled: its engines' and "
        "default images' release, kept through operator upgrades.",
    )
    image: str | None = Field(default=None, description="The image its (first pool's) serving pods run.")


class ColdStartPhase(Spec):
    name: Literal["scheduled", "initialized", "started", "ready"] = Field(
        description="The moment the phase ends: scheduled (PodScheduled), initialized (the last init "
        "container's end), started (the serving container running: its image pulled), ready (the "
        "Ready condition: the model loaded)."
    )
    seconds: int = Field(description="Whole seconds since the previous phase ended.")


class ColdStartStatus(Spec):
    """The last replica that started from nothing (a new pod, or a multi-node group's slowest
    member), measured from the pod's own timestamps (docs/autoscaling.md, "Cold starts")."""

    pod_name: str = Field(description="The pod measured.")
    pods: int = Field(default=1, description="Pods of the replica: 1, or the multi-node group's size.")
    started_at: str = Field(description="The pod's creationTimestamp: where the cold start begins.")
    ready_at: str = Field(description="Its Ready condition's lastTransitionTime: where it ends.")
    phases: list[ColdStartPhase] = Field(description="scheduled, initialized, started, ready, in order.")
    total_seconds: int = Field(description="readyAt - startedAt: the phases' sum.")


class Phase(StrEnum):
    PENDING = "Pending"
    FETCHING_MODEL = "FetchingModel"
    BUILDING_ENGINE = "BuildingEngine"
    DEPLOYING = "Deploying"
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class LLMDeploymentStatus(Spec):
    """What the operator observed; written by it only (docs/api.md, Status)."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status is about; 0 until the operator writes."
    )
    phase: Phase | None = Field(
        default=None,
        description="Pending, FetchingModel, BuildingEngine, Deploying, Ready, Progressing, Degraded or "
        "Failed.",
    )
    reason: str | None = Field(default=None, description="CamelCase reason of the phase.")
    message: str | None = Field(default=None, description="The phase in words.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="One per type: Ready, Reconciling and Stalled (kstatus), Progressing, Degraded, "
        "Available, EngineReady and, where they apply, ModelCached, PickerReady, AutoscalingActive "
        "and HoldCoversColdStart (docs/api.md says what each means).",
    )
    replicas: int = Field(default=0, description="Replicas planned, over all pools.")
    ready_replicas: int = Field(default=0, description="Ready replicas, over all pools.")
    selector: str | None = Field(
        default=None,
        description="Label selector of the serving leader pods (the scale subresource's, for an HPA).",
    )
    revisions: RevisionsStatus | None = None
    placement: PlacementStatus | None = None
    engine: EngineStatus | None = None
    model: ModelStatus | None = None
    endpoints: EndpointsStatus | None = None
    release: ReleaseStatus | None = None
    last_cold_start: ColdStartStatus | None = None
    launch_secret: str | None = Field(
        default=None,
        description="The Secret the operator created with the launch identity of this deployment's "
        "multi-node groups (the leader's and the workers' certificates): a Secret under that name "
        "that it did not create is never mounted.",
    )
    admin_key_secret: str | None = Field(
        default=None,
        description="The Secret the operator created with the key of Triton's admin APIs (model "
        "repository, shared memory, logging, trace) in this deployment's pods: a Secret under that "
        "name that it did not create is never used.",
    )
    picker_tls_secret: str | None = Field(
        default=None,
        description="The Secret the operator created with the endpoint picker's certificate "
        "(routing.mode inference-pool; ca.crt verifies it): a Secret under that name that it did "
        "not create is never mounted.",
    )
    creating_secrets: dict[str, str] | None = Field(
        default=None,
        description="The Secrets the operator is creating, by the field above that records each "
        "once created: written before the create, so that after a restart between the create and "
        "that record the operator knows the Secret as its own.",
    )


class LLMDeployment(BaseModel):
    """The whole object as the operator reads it (metadata kept as a plain mapping)."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: LLMDeploymentSpec
    status: LLMDeploymentStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))
