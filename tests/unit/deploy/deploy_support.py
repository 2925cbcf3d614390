"""Shared by the deploy tests: the repository root, Kubernetes schema validation, Naiad's own CLI parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes_validate import utils as k8s

ROOT = Path(__file__).resolve().parents[3]
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0", "1.37.0")  # oldest and newest the chart is checked against


def validate_core(manifest: dict[str, Any]) -> None:
    """Strict validation (unknown fields are errors) against the Kubernetes OpenAPI schemas."""
    for version in KUBERNETES_VERSIONS:
        k8s.validate(manifest, version, strict=True)


def validate_containers(containers: list[dict[str, Any]]) -> None:
    """Containers embedded in a custom resource, checked as the core Container type (inside a Pod)."""
    validate_core({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": {"containers": containers}})


def validate_label_selector(selector: dict[str, Any]) -> None:
    """A LabelSelector embedded in a custom resource, checked through a NetworkPolicy's podSelector."""
    validate_core({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "check"},
                   "spec": {"podSelector": selector}})


def parse_serve_args(args: list[str]):
    """The container's args run through `naiad serve`'s real parser: every flag must exist and parse."""
    from naiad.cli.flags import config_from_args
    from naiad.cli.main import build_parser

    return config_from_args(build_parser().parse_args(["serve", *args]))


def check_schema(document: Any, schema: dict[str, Any], where: str = "$") -> None:
    """A small structural check for custom resources whose CRD schemas are not available offline:
    `schema` maps each allowed key to a type, a nested schema, or a one-element list (list of that)."""
    assert isinstance(schema, dict) and isinstance(document, dict), f"{where}: expected an object"
    unknown = set(document) - set(schema)
    assert not unknown, f"{where}: unknown field(s) {sorted(unknown)}"
    for key, value in document.items():
        expected = schema[key]
        path = f"{where}.{key}"
        if isinstance(expected, dict):
            check_schema(value, expected, path)
        elif isinstance(expected, list):
            assert isinstance(value, list), f"{path}: expected a list"
            for index, item in enumerate(value):
                if isinstance(expected[0], dict):
                    check_schema(item, expected[0], f"{path}[{index}]")
                else:
                    assert isinstance(item, expected[0]), f"{path}[{index}]: expected {expected[0].__name__}"
        elif expected is not Any:
            assert isinstance(value, expected), f"{path}: expected {expected.__name__}, got {type(value).__name__}"
