"""`naiad repo lint`: every problem of a model repository that would stop a model loading, with file/line/field.

The checks follow what the server does when it loads a model (naiad.core.model_loader) but collect every
problem instead of stopping at the first, and run on the files alone: no server, and no framework imported but
onnxruntime, which reads an ONNX model's inputs and outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.completion import default_model_filename, resolve_backend
from naiad.config.ensemble import check_ensemble_graph, composing_models
from naiad.config.model_config import ConfigError, parse_config_text
from naiad.config.onnx_io import check_model_io, completed_max_batch_size
from naiad.config.validation import validate_config
from naiad.tools.repo_lint.onnx_model import onnx_tensors

CONFIG = "config.pbtxt"
AUTO_COMPLETE_FILES = ("model.onnx", "model.pt", "model.py", "model.pt2", "model.xml", "model.savedmodel",
                       "model.graphdef", "xgboost.json", "xgboost.ubj", "xgboost.model", "model.txt", "checkpoint.tl")
DEFAULT_MAX_BATCH_SIZE = 4  # the server's default for auto-completed batching (--backend-config default-max-batch-size)
_WHERE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::\d+)?: (?P<rest>.*)$", re.S)
_FIELD = re.compile(r"^field '(?P<field>[^']+)': (?P<message>.*)$", re.S)


@dataclass(frozen=True)
class Problem:
    severity: str  # error | warning
    path: str
    line: int  # 0 when the problem is not on one line
    field: str
    message: str
    model: str = ""

    def text(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        field = f" field '{self.field}':" if self.field else ""
        return f"{where}: {self.severity}:{field} {self.message}"

    def to_json(self) -> dict[str, object]:
        return {"severity": self.severity, "model": self.model, "file": self.path, "line": self.line or None,
                "field": self.field or None, "message": self.message}


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """Numeric version directories as the server reads them (names starting with '0' are ignored)."""
    return {int(p.name): p for p in model_dir.iterdir()
            if p.is_dir() and p.name.isdigit() and p.name.isascii() and not p.name.startswith("0")}


class ModelLinter:
    def __init__(self, model_dir: Path, repository_models: set[str], gpus: int = 0) -> None:
        self.dir = model_dir
        self.name = model_dir.name
        self.repository_models = repository_models
        self.gpus = gpus
        self.config_path = model_dir / CONFIG
        self.text = ""
        self.problems: list[Problem] = []

    def line_of(self, needle: str, occurrence: int = 1) -> int:
        """The line of the `occurrence`-th uncommented mention of `needle` (0 when absent)."""
        for number, line in enumerate(self.text.splitlines(), start=1):
            if needle in line and not line.lstrip().startswith("#"):
                occurrence -= 1
                if occurrence == 0:
                    return number
        return 0

    def add(self, message: str, field: str = "", needle: str = "", severity: str = "error",
            path: Path | None = None, line: int = 0, occurrence: int = 1) -> None:
        line = line or (self.line_of(needle, occurrence) if needle else 0)
        self.problems.append(Problem(severity, str(path or self.config_path), line, field, message, self.name))

    def add_config_error(self, error: ConfigError) -> None:
        """A message from naiad.config ('<file>:<line>: field 'x': ...') as a Problem."""
        text, line, path = str(error), 0, self.config_path
        match = _WHERE.match(text)
        if match and Path(match["file"]) == self.config_path:
            text, line = match["rest"], int(match["line"])
        elif text.startswith(f"{self.config_path}: "):
            text = text[len(f"{self.config_path}: "):]
        field = _FIELD.match(text)
        if field:
            self.add(field["message"], field["field"], path=path, line=line)
        else:
            self.add(text, path=path, line=line)

    # ------------------------------------------------------------------ checks
    def run(self) -> list[Problem]:
        versions = version_dirs(self.dir)
        config = self._read_config(versions)
        if config is None:
            return self.problems
        if config.name and config.name != self.name:
            self.add(f"'{config.name}' does not match the model directory name '{self.name}'", "name", "name:")
        config.name = self.name
        try:
            resolve_backend(config, versions[max(versions)] if versions else None)
        except ConfigError as exc:
            self.add(str(exc), "backend")
        if not versions:
            self.add(f"no version directory: the model files go in {self.dir}/1/", path=self.dir)
        self._tensors(config)
        self._batching(config)
        self._instances(config)
        self._versions(config, versions)
        self._files(config)
        if config.platform == "ensemble":
            self._ensemble(config)
        if not [p for p in self.problems if p.severity == "error"]:
            try:  # whatever the server also refuses that the checks above do not cover
                validate_config(config, str(self.config_path), self.text)
            except ConfigError as exc:
                self.add_config_error(exc)
        if config.backend == "onnxruntime" and not [p for p in self.problems if p.severity == "error"]:
            self._onnx_io(config)
        return self.problems

    def _read_config(self, versions: dict[int, Path]) -> mc.ModelConfig | None:
        if not self.config_path.is_file():
            files = [f for v in versions.values() for f in AUTO_COMPLETE_FILES if (v / f).exists()]
            if not files:
                self.add(f"no {CONFIG}, and no model file the server can complete a config from "
                         f"({', '.join(AUTO_COMPLETE_FILES[:4])}, ...)", path=self.dir)
                return None
            return mc.ModelConfig()  # the server completes it from the model file
        try:
            self.text = self.config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.add(f"cannot read: {exc}")
            return None
        try:
            return parse_config_text(self.text, str(self.config_path))
        except ConfigError as exc:
            self.add_config_error(exc)
            return None

    def _tensors(self, config: mc.ModelConfig) -> None:
        for kind, tensors in (("input", config.input), ("output", config.output)):
            seen: dict[str, int] = {}
            for tensor in tensors:
                needle = f'"{tensor.name}"'
                if not tensor.name:
                    self.add(f"an {kind} has no name", kind, f"{kind}")
                elif tensor.name in seen:
                    self.add(f"'{tensor.name}' is listed more than once", kind, needle,
                             occurrence=seen[tensor.name] + 1)
                seen[tensor.name] = seen.get(tensor.name, 0) + 1
                if tensor.data_type == mc.TYPE_INVALID:
                    self.add(f"'{tensor.name}' needs a data_type (TYPE_FP32, TYPE_STRING, ...)", f"{kind}.data_type", needle)
                scalar = tensor.HasField("reshape") and not list(tensor.reshape.shape)
                if not list(tensor.dims) and not scalar and config.platform != "ensemble":
                    self.add(f"'{tensor.name}' has no dims", f"{kind}.dims", needle)
                for dim in tensor.dims:
                    if dim == 0 or dim < -1:
                        self.add(f"dimension {dim} of '{tensor.name}' must be >= 1 or -1", f"{kind}.dims", needle)
                if kind == "output" and tensor.label_filename and not (self.dir / tensor.label_filename).is_file():
                    self.add(f"label file '{tensor.label_filename}' of '{tensor.name}' is not in {self.dir}",
                             f"{kind}.label_filename", tensor.label_filename)

    def _batching(self, config: mc.ModelConfig) -> None:
        if config.max_batch_size < 0:
            self.add(f"must be >= 0, got {config.max_batch_size}", "max_batch_size", "max_batch_size")
        if config.HasField("dynamic_batching"):
            for size in config.dynamic_batching.preferred_batch_size:
                if size < 1 or (config.max_batch_size > 0 and size > config.max_batch_size):
                    self.add(f"{size} must be in [1, max_batch_size={config.max_batch_size}]",
                             "dynamic_batching.preferred_batch_size", "preferred_batch_size")
        if config.HasField("sequence_batching") and config.HasField("dynamic_batching"):
            self.add("a model has one scheduler: dynamic_batching and sequence_batching exclude each other",
                     "sequence_batching", "sequence_batching")

    def _instances(self, config: mc.ModelConfig) -> None:
        for group in config.instance_group:
            if group.count < 0:
                self.add(f"must be >= 1, got {group.count}", "instance_group.count", "count")
            if group.kind == mc.ModelInstanceGroup.KIND_GPU and not self.gpus:
                self.add("KIND_GPU instances need a GPU; none is visible here (KIND_CPU or KIND_AUTO run anywhere)",
                         "instance_group.kind", "KIND_GPU", severity="warning")
            for gpu in group.gpus:
                if self.gpus and gpu >= self.gpus:
                    self.add(f"GPU {gpu} does not exist ({self.gpus} visible)", "instance_group.gpus", "gpus")

    def _versions(self, config: mc.ModelConfig, versions: dict[int, Path]) -> None:
        policy = config.version_policy
        if policy.HasField("specific"):
            for version in policy.specific.versions:
                if version not in versions:
                    self.add(f"version {version} is asked for but {self.dir}/{version}/ does not exist",
                             "version_policy.specific.versions", "versions")
        if policy.HasField("latest") and policy.latest.num_versions < 1:
            self.add("must be >= 1", "version_policy.latest.num_versions", "num_versions")
        for entry in sorted(self.dir.iterdir()):
            if entry.is_dir() and entry.name.isdigit() and entry.name.startswith("0"):
                self.add(f"directory '{entry.name}' is ignored: version numbers start at 1 and have no leading zero",
                         path=entry, severity="warning")

    def _chosen_versions(self, config: mc.ModelConfig) -> dict[int, Path]:
        """The version directories the server loads under the config's version_policy."""
        chosen = version_dirs(self.dir)
        policy = config.version_policy
        if policy.HasField("specific"):
            chosen = {v: p for v, p in chosen.items() if v in policy.specific.versions}
        elif not policy.HasField("all") and chosen:
            count = policy.latest.num_versions if policy.HasField("latest") and policy.latest.num_versions > 0 else 1
            chosen = {v: chosen[v] for v in sorted(chosen)[-count:]}
        return chosen

    def _files(self, config: mc.ModelConfig) -> None:
        if config.platform == "ensemble" or not config.backend:
            return
        filename = default_model_filename(config)
        if not filename:
            return  # a backend from --backend-directory: its own model.py runs
        chosen = self._chosen_versions(config)
        for version, path in sorted(chosen.items()):
            if not (path / filename).exists():
                field = "default_model_filename" if config.default_model_filename else "backend"
                self.add(f"no '{filename}' in version {version} (the {config.backend} backend loads that file)",
                         field, path=path)
        for key, value in config.parameters.items():
            if key == "EXECUTION_ENV_PATH":
                target = value.string_value.replace("$$TRITON_MODEL_DIRECTORY", str(self.dir))
                if not Path(target).exists():
                    self.add(f"EXECUTION_ENV_PATH '{value.string_value}' does not exist", "parameters", "EXECUTION_ENV_PATH")
        for warmup in config.model_warmup:
            for name, spec in warmup.inputs.items():
                if spec.WhichOneof("input_data_type") == "input_data_file":
                    if not (self.dir / "warmup" / spec.input_data_file).is_file():
                        self.add(f"warm-up '{warmup.name}' input '{name}' reads warmup/{spec.input_data_file}, "
                                 "which does not exist", "model_warmup.inputs.input_data_file", spec.input_data_file)

    def _onnx_io(self, config: mc.ModelConfig) -> None:
        """The config's tensors against the ONNX model's, as the server checks them when it loads."""
        reported: set[str] = set()
        for _, path in sorted(self._chosen_versions(config).items()):
            model_file = path / default_model_filename(config)
            try:
                inputs, outputs = onnx_tensors(model_file)
            except ValueError as exc:
                self.add(str(exc), "default_model_filename" if config.default_model_filename else "backend",
                         path=model_file)
                continue
            effective = mc.ModelConfig()
            effective.CopyFrom(config)
            # Without a config file the server completes every tensor; otherwise it adds the ones left out.
            effective.max_batch_size = completed_max_batch_size(config, inputs, outputs, DEFAULT_MAX_BATCH_SIZE)
            for problem in check_model_io(effective, inputs, outputs, count_inputs=False):
                if problem.message in reported:
                    continue
                reported.add(problem.message)
                kind = problem.field.split(".")[0]
                self.add(problem.message, problem.field, line=self._tensor_line(kind, problem.tensor))

    def _tensor_line(self, kind: str, tensor: str) -> int:
        """The line naming `tensor` in the config's `kind` (input/output) list."""
        start = self.line_of(f"{kind} [") or self.line_of(f"{kind} {{") or self.line_of(kind)
        for number, line in enumerate(self.text.splitlines(), start=1):
            if number >= start and f'"{tensor}"' in line and not line.lstrip().startswith("#"):
                return number
        return start

    def _ensemble(self, config: mc.ModelConfig) -> None:
        for model in composing_models(config):
            if model not in self.repository_models:
                self.add(f"step model '{model}' is not in the repository", "ensemble_scheduling.step.model_name",
                         f'"{model}"')
        try:
            check_ensemble_graph(config, str(self.config_path))
        except ConfigError as exc:
            self.add_config_error(exc)


def lint_repository(root: Path, gpus: int = 0) -> list[Problem]:
    """Every problem of every model under `root` (directories only; hidden entries skipped)."""
    root = Path(root)
    if not root.is_dir():
        return [Problem("error", str(root), 0, "", "not a directory")]
    models = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = {p.name for p in models}
    problems: list[Problem] = []
    for model_dir in models:
        problems += ModelLinter(model_dir, names, gpus).run()
    if not models:
        problems.append(Problem("warning", str(root), 0, "", "no model directories"))
    return problems
