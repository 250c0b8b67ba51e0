"""What the build Job passes to engine/build.py about conversion and calibration, and the claim
it mounts for the calibration dataset (plan/conversion.py decides; this turns it into args)."""

from __future__ import annotations

from typing import Any

from llm_operator.api.v1alpha1 import QUANTIZED_PRECISIONS, Calibration, LLMDeploymentSpec
from llm_operator.plan import conversion
from llm_operator.plan.types import PoolPlan

CALIBRATION_MOUNT = "/calibration"
CALIBRATION_VOLUME = "calibration"


def calibration(spec: LLMDeploymentSpec, pool: PoolPlan) -> Calibration | None:
    """The dataset this build calibrates on; None where it converts without calibration."""
    build = spec.engine.build
    if build is None or not conversion.needs_calibration(spec) or conversion.fp8_rowwise(spec, pool):
        return None
    return build.calibration


def key_parts(spec: LLMDeploymentSpec, pool: PoolPlan) -> dict[str, Any]:
    """What of conversion changes the engine beyond the other key parts: a family set by hand
    (a told one follows the model name), the calibration data, the large-model fp8 route, and for
    quantized formats that build.py takes the activation dtype from the checkpoint (its config.json,
    so the model and revision already decide it); their engines cached before were all float16,
    so their keys change once. fp16/bf16 name their dtype: their keys stay."""
    parts: dict[str, Any] = {}
    if spec.engine.precision.value in QUANTIZED_PRECISIONS:
        parts["activationDtype"] = "checkpoint"
    if spec.model.family is not None:
        parts["family"] = spec.model.family.value
    calib = calibration(spec, pool)
    if calib is not None:
        parts["calibration"] = {"datasetUri": calib.dataset_uri, "size": calib.size}
    if conversion.fp8_rowwise(spec, pool):
        parts["fp8Rowwise"] = True
    return parts


def args(spec: LLMDeploymentSpec, pool: PoolPlan) -> list[str]:
    family = conversion.family(spec.model)
    if family is None:  # plan/conversion.check refuses this at planning
        raise ValueError(f"no model family for {spec.model.name}")
    out = ["--family", family.value]
    calib = calibration(spec, pool)
    if calib is not None:
        uri = calib.dataset_uri
        if uri.startswith("pvc://"):
            uri = f"{CALIBRATION_MOUNT}/{uri.removeprefix('pvc://').partition('/')[2].strip('/')}"
        out += ["--calib-dataset", uri, "--calib-size", str(calib.size)]
    if conversion.fp8_rowwise(spec, pool):
        out.append("--fp8-rowwise")
    return out


def calibration_volume(
    spec: LLMDeploymentSpec, pool: PoolPlan
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(volumeMount, volume) of the dataset's claim, read-only; None without a pvc:// dataset."""
    calib = calibration(spec, pool)
    if calib is None or not calib.dataset_uri.startswith("pvc://"):
        return None
    claim = calib.dataset_uri.removeprefix("pvc://").partition("/")[0]
    return (
        {"name": CALIBRATION_VOLUME, "mountPath": CALIBRATION_MOUNT, "readOnly": True},
        {"name": CALIBRATION_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
    )
