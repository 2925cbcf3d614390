"""deploy/kserve: the ClusterServingRuntime (and its example InferenceService) for Naiad."""

from __future__ import annotations

from typing import Any

import yaml

from tests.unit.deploy.deploy_support import (
    ROOT,
    check_schema,
    parse_serve_args,
    validate_containers,
)

RUNTIME = ROOT / "deploy" / "kserve" / "cluster-serving-runtime.yaml"
EXAMPLE = ROOT / "deploy" / "kserve" / "inference-service-example.yaml"

# The ServingRuntimeSpec fields this manifest may use (serving.kserve.io/v1alpha1); containers are
# checked separately as core Containers.
SERVING_RUNTIME_SCHEMA = {
    "apiVersion": str, "kind": str,
    "metadata": {"name": str, "labels": dict},
    "spec": {
        "annotations": dict,
        "supportedModelFormats": [{"name": str, "version": str, "autoSelect": bool, "priority": int}],
        "protocolVersions": [str],
        "multiModel": bool,
        "disabled": bool,
        "containers": [dict],
    },
}
INFERENCE_SERVICE_SCHEMA = {
    "apiVersion": str, "kind": str, "metadata": {"name": str},
    "spec": {"predictor": {"model": {"modelFormat": {"name": str}, "protocolVersion": str, "runtime": str,
                                     "storageUri": str}}},
}


def load(path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_runtime_is_a_cluster_serving_runtime_of_the_right_shape():
    runtime = load(RUNTIME)
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ClusterServingRuntime")
    check_schema(runtime, SERVING_RUNTIME_SCHEMA)
    validate_containers(runtime["spec"]["containers"])


def test_runtime_speaks_v2_and_grpc_v2_for_onnx_and_triton_models():
    spec = load(RUNTIME)["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "triton"}
    assert all(f["autoSelect"] for f in formats.values())


def test_runtime_container_follows_kserve_conventions_and_naiads_flags():
    spec = load(RUNTIME)["spec"]
    container = spec["containers"][0]
    assert container["name"] == "kserve-container"
    config = parse_serve_args(container["args"])
    assert config.model_repositories == ["/mnt/models"]  # where KServe's storage initializer puts the model
    assert (config.http_port, config.grpc_port) == (8080, 9000)
    assert container["ports"][0]["containerPort"] == config.http_port
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(config.metrics_port)
    assert container["securityContext"]["runAsNonRoot"] is True


def test_example_inference_service_uses_the_runtime():
    service = load(EXAMPLE)
    check_schema(service, INFERENCE_SERVICE_SCHEMA)
    model = service["spec"]["predictor"]["model"]
    runtime = load(RUNTIME)
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


def test_structural_check_catches_unknown_fields():
    runtime = load(RUNTIME)
    runtime["spec"]["protocolVersion"] = ["v2"]  # a typo KServe would silently drop
    try:
        check_schema(runtime, SERVING_RUNTIME_SCHEMA)
    except AssertionError as exc:
        assert "protocolVersion" in str(exc)
    else:
        raise AssertionError("the typo was not caught")
