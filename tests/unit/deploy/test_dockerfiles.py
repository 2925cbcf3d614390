"""The CPU and GPU Dockerfiles: hadolint-clean, multi-stage, non-root, health-checked, and consistent with
the repository (no engine here to build them: see docs/deploy.md)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.unit.deploy.deploy_support import ROOT

HADOLINT = Path(sys.executable).with_name("hadolint")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and parser directives dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    assert not pending, f"{path.name}: dangling line continuation"
    return result


def stages(parsed: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in parsed:
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def build_args(parsed: list[tuple[str, str]]) -> dict[str, str]:
    values = {}
    for keyword, rest in parsed:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            values[name] = value
    return values


DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_finds_nothing(name):
    process = subprocess.run([str(HADOLINT), "--no-color", str(ROOT / name)], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_multi_stage_non_root_with_health_check(name):
    parsed = instructions(ROOT / name)
    built = stages(parsed)
    assert len(built) >= 2, "expected a build stage and a runtime stage"
    runtime = built[-1]
    assert not any(k == "RUN" and ("gcc" in r or "build-essential" in r) for k, r in runtime), "no compilers at run time"
    users = [r for k, r in runtime if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the runtime stage must switch to a non-root user"
    assert re.fullmatch(r"\d+(:\d+)?", users[-1]), "a numeric USER lets Kubernetes' runAsNonRoot verify it"
    health = [r for k, r in runtime if k == "HEALTHCHECK"]
    assert health and "/v2/health/ready" in health[0]
    command = health[0].split("CMD", 1)[1].strip()
    argv = __import__("json").loads(command)
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], "HEALTHCHECK", "exec")  # the probe is valid Python
    entry = [r for k, r in runtime if k == "ENTRYPOINT"]
    assert entry and __import__("json").loads(entry[-1]) == ["naiad", "serve"]
    assert ("STOPSIGNAL", "SIGTERM") in runtime
    copies_from_build = [r for k, r in runtime if k == "COPY" and r.startswith("--from=build")]
    assert copies_from_build, "the runtime stage takes the installed venv from the build stage"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_sources_exist_and_are_not_docker_ignored(name):
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for keyword, rest in instructions(ROOT / name):
        if keyword != "COPY" or "--from=" in rest:
            continue
        parts = [p for p in shlex.split(rest) if not p.startswith("--")]
        for source in parts[:-1]:
            source = source.rstrip("/")
            assert (ROOT / source).exists(), f"{name}: COPY source '{source}' is missing from the repository"
            for pattern in ignored:
                pattern = pattern.rstrip("/")
                assert not (fnmatch.fnmatch(source, pattern) or source.startswith(pattern + "/")), \
                    f"{name}: '{source}' is excluded by .dockerignore pattern '{pattern}'"


def test_cpu_image_is_python_311_slim_and_installs_the_package():
    parsed = instructions(ROOT / "Dockerfile")
    base = build_args(parsed)["PYTHON_IMAGE"]
    assert base.startswith("python:3.11-slim")
    runs = " ".join(r for k, r in parsed if k == "RUN")
    assert re.search(r'pip install [^&]*"\.\$\{NAIAD_EXTRAS:\+\[\$\{NAIAD_EXTRAS\}\]\}"', runs), \
        "the build stage installs the package from the repository (with optional extras)"


def test_gpu_image_is_cuda_runtime_with_onnxruntime_gpu_matching_the_cpu_pin():
    parsed = instructions(ROOT / "Dockerfile.gpu")
    args = build_args(parsed)
    assert re.fullmatch(r"nvidia/cuda:12\.[0-9.]+-cudnn-runtime-ubuntu\d\d\.\d\d", args["CUDA_IMAGE"])
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = dict(dep.split("==") for dep in pyproject["project"]["dependencies"] if "==" in dep)
    assert args["ONNXRUNTIME_GPU"] == f"onnxruntime-gpu=={pins['onnxruntime']}", \
        "keep onnxruntime-gpu on the same release as the CPU onnxruntime pin"


def test_extras_the_images_document_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in DOCKERFILES:
        text = (ROOT / name).read_text()
        assert "NAIAD_EXTRAS" in text
        for mentioned in re.findall(r"NAIAD_EXTRAS=([a-z0-9]+)", text):
            assert mentioned in extras, f"{name} mentions an extra pyproject.toml does not define: {mentioned}"
    assert {"gpu", "s3", "gcs", "azure", "cloud"} <= set(extras)


def test_entry_point_the_images_run_exists():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["naiad"] == "naiad.cli.main:main"


def test_image_default_command_parses_with_the_real_cli():
    from tests.unit.deploy.deploy_support import parse_serve_args

    cmd = __import__("json").loads([r for k, r in instructions(ROOT / "Dockerfile") if k == "CMD"][-1])
    config = parse_serve_args(cmd)
    assert config.model_repositories == ["/models"]
    assert (ROOT / "examples" / "models").is_dir(), "the image ships examples/models as its default repository"
