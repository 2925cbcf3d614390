"""Static checks of an ensemble's DAG: tensors produced once, inputs consumed, outputs reachable, no cycles."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import ConfigError


def check_ensemble_graph(config: mc.ModelConfig, source: str) -> None:
    """Raise ConfigError naming the ensemble, step and tensor for a graph Triton refuses."""
    name = config.name
    steps = config.ensemble_scheduling.step
    if not steps:
        raise ConfigError(f"{source}: field 'ensemble_scheduling.step': ensemble '{name}' must have at least one step")
    if config.instance_group:
        raise ConfigError(f"{source}: field 'instance_group': ensemble '{name}' must not have instance groups")
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    producers: dict[str, int] = {}
    for index, step in enumerate(steps):
        if not step.model_name:
            raise ConfigError(f"{source}: field 'ensemble_scheduling.step': step {index} of '{name}' has no model_name")
        for tensor in step.output_map.values():
            if tensor in producers or tensor in inputs:
                raise ConfigError(
                    f"{source}: ensemble '{name}': tensor '{tensor}' is produced more than once (step {index}, '{step.model_name}')"
                )
            producers[tensor] = index
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        for tensor in step.input_map.values():
            if tensor not in inputs and tensor not in producers:
                raise ConfigError(
                    f"{source}: ensemble '{name}': step {index} ('{step.model_name}') reads tensor '{tensor}', "
                    "which is neither an ensemble input nor produced by a step"
                )
            consumed.add(tensor)
    for tensor in sorted(inputs - consumed):
        raise ConfigError(f"{source}: ensemble '{name}': input '{tensor}' is not used by any step")
    for tensor in sorted(outputs - set(producers)):
        raise ConfigError(f"{source}: ensemble '{name}': output '{tensor}' is not produced by any step")
    _check_acyclic(config, source)


def _check_acyclic(config: mc.ModelConfig, source: str) -> None:
    """Every step must become runnable from the ensemble inputs alone."""
    available = {t.name for t in config.input}
    remaining = list(enumerate(config.ensemble_scheduling.step))
    while remaining:
        ready = [(i, s) for i, s in remaining if set(s.input_map.values()) <= available]
        if not ready:
            names = [s.model_name for _, s in remaining]
            raise ConfigError(f"{source}: ensemble '{config.name}': steps {names} form a cycle")
        for _, step in ready:
            available.update(step.output_map.values())
        remaining = [(i, s) for i, s in remaining if (i, s) not in ready]


def composing_models(config: mc.ModelConfig) -> list[str]:
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def apply_decoupled_steps(config: mc.ModelConfig, decoupled_steps: set[int]) -> None:
    """An ensemble with a decoupled step is decoupled itself (as Triton makes it, whatever its config says).

    Each response of a decoupled step runs the steps downstream of it separately, so a step may
    not combine tensors descending from two different decoupled steps: their responses cannot
    be paired. Raises ConfigError for such a graph.
    """
    if not decoupled_steps:
        return
    origin: dict[str, int | None] = {t.name: None for t in config.input}
    remaining = list(enumerate(config.ensemble_scheduling.step))
    while remaining:
        ready = [(i, s) for i, s in remaining if set(s.input_map.values()) <= origin.keys()]
        if not ready:
            break  # a cycle: check_ensemble_graph reports it
        for index, step in ready:
            sources = {source for t in step.input_map.values() if (source := origin[t]) is not None}
            if len(sources) > 1:
                raise ConfigError(
                    f"ensemble '{config.name}': step {index} ('{step.model_name}') receives inputs originated "
                    f"from different decoupled models (steps {sorted(sources)})"
                )
            produced = index if index in decoupled_steps else next(iter(sources), None)
            for tensor in step.output_map.values():
                origin[tensor] = produced
        remaining = [(i, s) for i, s in remaining if (i, s) not in ready]
    config.model_transaction_policy.decoupled = True
