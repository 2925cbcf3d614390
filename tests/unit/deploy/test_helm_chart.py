"""deploy/helm/naiad rendered by Helm's own engine (helm-python-sdk wraps Helm's Go SDK) and validated
against the Kubernetes schemas; the container's args go through Naiad's real CLI parser."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.unit.deploy.deploy_support import (
    ROOT,
    check_schema,
    parse_serve_args,
    validate_core,
    validate_label_selector,
)

CHART = ROOT / "deploy" / "helm" / "naiad"
ADAPTER_VALUES = ROOT / "deploy" / "prometheus-adapter" / "values.yaml"

SERVICE_MONITOR_SCHEMA = {
    "apiVersion": str, "kind": str,
    "metadata": {"name": str, "labels": dict},
    "spec": {
        "selector": dict,
        "namespaceSelector": {"matchNames": [str]},
        "endpoints": [{"port": str, "path": str, "interval": str, "scrapeTimeout": str}],
    },
}


def render(values: dict[str, Any] | None = None, namespace: str = "ml") -> dict[str, dict]:
    """{kind: manifest} of a `helm template` of the chart."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values or {}, name="demo", namespace=namespace)
    manifests: dict[str, dict] = {}
    for path, text in files.items():
        if not path.endswith(".yaml"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                assert document["kind"] not in manifests, f"two {document['kind']} manifests"
                manifests[document["kind"]] = document
    return manifests


def container(manifests: dict[str, dict]) -> dict:
    return manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]


VALUE_SETS = {
    "defaults": {},
    "volume": {"modelRepository": {"source": "volume", "volume": {"persistentVolumeClaim": {"claimName": "models"}}}},
    "s3": {"modelRepository": {"source": "uri", "uri": "s3://bucket/models", "credentialsSecret": "s3-creds"}},
    "autoscaling": {"autoscaling": {"enabled": True, "queueTime": {"averageValue": "20000"}},
                    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "explicit": {"server": {"modelControlMode": "explicit", "loadModels": ["a", "b"],
                            "extraArgs": ["--http-restricted-api=model-repository:x-admin=s3cret"]},
                 "podDisruptionBudget": {"enabled": False}, "serviceAccount": {"create": False}},
}


def test_helm_lint_is_clean():
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("case", list(VALUE_SETS))
def test_rendered_manifests_validate_against_kubernetes_schemas(case):
    manifests = render(VALUE_SETS[case])
    for kind, manifest in manifests.items():
        if kind == "ServiceMonitor":
            check_schema(manifest, SERVICE_MONITOR_SCHEMA)
            validate_label_selector(manifest["spec"]["selector"])
        else:
            validate_core(manifest)
    assert {"Deployment", "Service"} <= set(manifests)


@pytest.mark.parametrize("case", list(VALUE_SETS))
def test_container_args_are_accepted_by_naiad_serve(case):
    args = container(render(VALUE_SETS[case]))["args"]
    config = parse_serve_args(args)
    assert (config.http_port, config.grpc_port, config.metrics_port) == (8000, 8001, 8002)


def test_probes_use_the_health_endpoints_on_the_http_port():
    spec = container(render())
    assert spec["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert spec["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert spec["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert spec["startupProbe"]["failureThreshold"] * spec["startupProbe"]["periodSeconds"] >= 300


def test_service_exposes_http_grpc_and_metrics_of_the_pods():
    manifests = render()
    service = manifests["Service"]["spec"]
    pod = manifests["Deployment"]["spec"]["template"]
    names = {port["name"] for port in container(manifests)["ports"]}
    assert {p["name"]: p["port"] for p in service["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {p["targetPort"] for p in service["ports"]} <= names
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    assert manifests["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_pods_run_non_root_read_only_with_a_writable_tmp():
    pod = render()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    spec = pod["containers"][0]
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in spec["volumeMounts"]


def test_graceful_scale_down_window_covers_the_drain():
    deployment = render({"server": {"exitTimeoutSecs": 45}, "preStopSleepSeconds": 7})["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert "--exit-timeout-secs=45" in pod["containers"][0]["args"]
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "7"]
    assert pod["terminationGracePeriodSeconds"] > 45 + 7
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_volume_repository_is_mounted_read_only():
    manifests = render(VALUE_SETS["volume"])
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert "--model-repository=/models" in pod["containers"][0]["args"]


def test_object_store_repository_gets_the_credentials_secret():
    spec = container(render(VALUE_SETS["s3"]))
    assert "--model-repository=s3://bucket/models" in spec["args"]
    assert spec["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert not any(m["name"] == "models" for m in spec["volumeMounts"])


def test_hpa_scales_the_deployment_on_naiads_queue_metrics_from_the_adapter():
    manifests = render(VALUE_SETS["autoscaling"])
    hpa = manifests["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": manifests["Deployment"]["metadata"]["name"]}
    pod_metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["metrics"] if m["type"] == "Pods"}
    assert pod_metrics == {
        "naiad_pending_requests": {"type": "AverageValue", "averageValue": "8"},
        "naiad_queue_time_us_per_request": {"type": "AverageValue", "averageValue": "20000"},
    }
    assert "replicas" not in manifests["Deployment"]["spec"], "the HPA owns the replica count"
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    assert set(pod_metrics) <= served, "every HPA metric must be one the adapter serves"


def test_adapter_rules_read_metrics_naiad_exports():
    from naiad.observability import metrics

    source = open(metrics.__file__).read()
    adapter = yaml.safe_load(ADAPTER_VALUES.read_text())
    for rule in adapter["rules"]["custom"]:
        series = rule["seriesQuery"].split("{", 1)[0]
        assert f'"{series}"' in source, f"{series} is not a metric Naiad exports"
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert "nv_inference_request_success" in source


def test_service_monitor_scrapes_the_metrics_port_of_the_service():
    manifests = render(VALUE_SETS["autoscaling"])
    monitor = manifests["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= manifests["Service"]["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}


def test_optional_objects_are_left_out_by_default():
    manifests = render()
    assert "HorizontalPodAutoscaler" not in manifests and "ServiceMonitor" not in manifests
    assert manifests["Deployment"]["spec"]["replicas"] == 2
    assert "PodDisruptionBudget" in manifests and "ServiceAccount" in manifests
    assert set(render(VALUE_SETS["explicit"])) == {"Deployment", "Service"}


@pytest.mark.parametrize("values,message", [
    ({"modelRepository": {"source": "uri"}}, "modelRepository.uri is required"),
    ({"modelRepository": {"source": "volume"}}, "modelRepository.volume is required"),
    ({"modelRepository": {"source": "ftp"}}, "modelRepository.source must be image, volume or uri"),
    ({"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None, "pendingRequests": {"averageValue": ""}}},
     "autoscaling.enabled needs at least one metric"),
])
def test_incomplete_values_fail_rendering_with_a_message(values, message):
    with pytest.raises(helm.HelmError) as info:
        render(values)
    assert message in str(info.value)
