"""KEDA's build keeps only the scalers the operator renders (e2e/cluster/tools/keda/trim_scalers.py):
the trigger switch loses the other cases and nothing else, and the names a Go file declares are
found whether grouped or not (what puts shared helpers back)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "e2e/cluster/tools/keda/trim_scalers.py"

SWITCH = """package scaling

func other() { /* before the markers: kept as is */ }

func buildScaler(ctx context.Context, client client.Client, triggerType string) (scalers.Scaler, error) {
	// TRIGGERS-START
	switch triggerType {
	case "activemq":
		return scalers.NewActiveMQScaler(config)
	case "cpu":
		return scalers.NewCPUMemoryScaler(corev1.ResourceCPU, config)
	// TODO: use other way for test.
	case "external-mock":
		return scalers.NewExternalMockScaler(config)
	case "prometheus":
		return scalers.NewPrometheusScaler(config)
	case "redis", "redis-cluster":
		return scalers.NewRedisScaler(ctx, false, false, config)
	default:
		return nil, fmt.Errorf("no scaler found for type: %s", triggerType)
	}
	// TRIGGERS-END
}
"""


@pytest.fixture(scope="module")
def trim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trim_scalers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_kept_cases_stay_and_their_constructors_are_named(trim: ModuleType) -> None:
    source, constructors = trim.trimmed_switch(SWITCH, {"prometheus", "cpu", "redis-cluster"})
    assert constructors == {"NewPrometheusScaler", "NewCPUMemoryScaler", "NewRedisScaler"}
    for gone in ("activemq", "NewActiveMQScaler", "external-mock", "TODO"):
        assert gone not in source
    # A case listing several types stays whole when one of them is kept.
    assert 'case "redis", "redis-cluster":' in source
    assert 'default:\n\t\treturn nil, fmt.Errorf("no scaler found' in source
    assert source.startswith("package scaling\n\nfunc other()") and source.endswith("// TRIGGERS-END\n}\n")


def test_a_type_keda_does_not_have_or_a_changed_file_stops_the_build(trim: ModuleType) -> None:
    with pytest.raises(SystemExit, match="no trigger type promethus"):
        trim.trimmed_switch(SWITCH, {"promethus"})
    with pytest.raises(SystemExit, match="markers"):
        trim.trimmed_switch(SWITCH.replace("// TRIGGERS-END", ""), {"prometheus"})


def test_declared_names_grouped_or_not(trim: ModuleType) -> None:
    go = """package scalers

const externalMetricType = "External"

var (
	defaultTimeout = 3
	retries        int
)

type (
	queueMetadata struct{}
)

func NewAzureQueueScaler(config *scalersconfig.ScalerConfig) (Scaler, error) {
	local := 1
	return nil, nil
}

func (s *azureQueueScaler) Close(ctx context.Context) error { return nil }
"""
    assert trim.declared(go) == {"externalMetricType", "defaultTimeout", "retries", "queueMetadata",
                                 "NewAzureQueueScaler"}  # fmt: skip
