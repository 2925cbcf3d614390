"""Model config variants: read the original config, apply a ConfigPoint, write `<model>_config_<n>` directories."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.tools.analyze.search import ConfigPoint

CONFIG_FILE = "config.pbtxt"


class VariantError(ValueError):
    """The model cannot be varied as asked (message says why)."""


def read_config(model_dir: Path) -> mc.ModelConfig | None:
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        return None
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except text_format.ParseError as exc:
        raise VariantError(f"{path}: {exc}") from None
    return config


def config_from_json(doc: dict[str, Any]) -> mc.ModelConfig:
    """The server's JSON view of a config (e.g. after auto-complete) as a ModelConfig."""
    config = mc.ModelConfig()
    json_format.ParseDict(doc, config, ignore_unknown_fields=True)
    return config


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == "ensemble" or config.HasField("ensemble_scheduling")


def check_variable(config: mc.ModelConfig) -> None:
    """A model whose own config is varied (an ensemble is varied through its composing models)."""
    if is_ensemble(config):
        raise VariantError(f"'{config.name}' is an ensemble inside an ensemble: nested ensembles are not searched")


def ensemble_members(config: mc.ModelConfig) -> list[str]:
    """The composing models, in step order, each once."""
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def apply_point(base: mc.ModelConfig, name: str, point: ConfigPoint) -> mc.ModelConfig:
    """A copy of `base` named `name` with the point's instance count, max_batch_size and batching."""
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.name = name
    kind = base.instance_group[0].kind if base.instance_group else mc.ModelInstanceGroup.KIND_CPU
    gpus = list(base.instance_group[0].gpus) if base.instance_group else []
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count = point.instances
    group.kind = kind
    group.gpus.extend(gpus)
    if base.max_batch_size > 0:
        config.max_batch_size = point.max_batch_size
    if config.HasField("sequence_batching"):
        return config  # the scheduler of a stateful model is not ours to change
    if point.batching == "off":
        config.ClearField("dynamic_batching")
    else:
        batching = config.dynamic_batching
        batching.SetInParent()
        del batching.preferred_batch_size[:]
        if point.batching == "preferred":
            batching.preferred_batch_size.append(point.max_batch_size)
    return config


def config_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def write_variant(source_dir: Path | None, target_dir: Path, config: mc.ModelConfig | None) -> Path:
    """`target_dir` gets the config and links (or copies) to everything else in the source model directory
    (the config alone without a source directory)."""
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir(parents=True)
    for entry in source_dir.iterdir() if source_dir is not None else []:
        if entry.name == CONFIG_FILE or entry.name == "configs":
            continue
        link = target_dir / entry.name
        try:
            os.symlink(entry.resolve(), link, target_is_directory=entry.is_dir())
        except OSError:
            if entry.is_dir():
                shutil.copytree(entry, link)
            else:
                shutil.copy2(entry, link)
    if config is not None:
        (target_dir / CONFIG_FILE).write_text(config_text(config))
    return target_dir


def write_ensemble_variant(source_repo: Path, target_repo: Path, ensemble: str, ensemble_config: mc.ModelConfig | None,
                           members: dict[str, mc.ModelConfig | None]) -> Path:
    """A repository of its own for one ensemble variant: the ensemble as it is, each member with its config."""
    if target_repo.exists():
        shutil.rmtree(target_repo)
    target_repo.mkdir(parents=True)
    write_variant(source_repo / ensemble, target_repo / ensemble, ensemble_config)
    for name, config in members.items():
        write_variant(source_repo / name, target_repo / name, config)
    return target_repo
