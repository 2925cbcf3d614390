"""Auto-completion in a throw-away worker: a Python model's auto_complete_config, or a tensor backend's for a
model with worker-process instances (model code and those frameworks never run in the server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import ConfigError, config_to_json, parse_config_json
from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.launcher import Launch, launch_for, spawn

AUTO_COMPLETE_TIMEOUT = 300.0


def _ask_worker(message: tuple[Any, ...], what: str, launch: Launch, timeout: float, error_prefix: str = "") -> Any:
    """Send one auto-complete message to a fresh worker and return what its "auto_ok" reply carries."""
    process, read_fd, write_fd = spawn(launch)
    channel = BlockingChannel(read_fd, write_fd, timeout)
    try:
        channel.send(message)
        try:
            reply = channel.receive()
        except TimeoutError:
            process.kill()  # hung in the model's code: nothing to wait for
            raise ConfigError(f"{what} did not finish within {timeout:.0f}s") from None
        except (EOFError, OSError):
            process.wait()
            raise ConfigError(
                f"the worker running {what} exited (code {process.returncode}); see the server log for its output"
            ) from None
    finally:
        channel.close()
        try:
            process.wait(timeout=10)
        except Exception:  # a worker that does not end is killed
            process.kill()
            process.wait()
    if reply[0] == "auto_error":
        raise ConfigError(f"{error_prefix}{reply[1]}")
    return reply[1]


def run_auto_complete(config_json: str, model_file: Path, launch: Launch, timeout: float = AUTO_COMPLETE_TIMEOUT) -> str | None:
    """Run TritonPythonModel.auto_complete_config in a throw-away worker; the completed config JSON, or None."""
    completed: str | None = _ask_worker(("auto", config_json, str(model_file)),
                                        f"auto_complete_config of '{model_file}'", launch, timeout, "Internal: ")
    return completed


def auto_complete_python_model(config: mc.ModelConfig, model_file: Path, shared_model_file: Path | None) -> None:
    """Apply the model's `auto_complete_config` staticmethod (a model.py without one is not spawned for).

    `model_file` is `<version>/<default_model_filename>`; a Python-based backend runs its shared
    model.py instead (the model's file, if any, is data and need not exist).
    """
    if shared_model_file is not None:
        code_file = shared_model_file
        version_dir = model_file if not config.default_model_filename else model_file.parent
        model_dir = version_dir.parent
    else:
        code_file = model_file
        model_dir = model_file.parent.parent
    try:
        source = code_file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"unable to read '{code_file}': {exc}") from None
    if "auto_complete_config" not in source:
        return
    launch = launch_for(config, model_dir)
    completed = run_auto_complete(config_to_json(config), code_file, launch)
    if completed is None:
        return
    name = config.name
    try:
        result = parse_config_json(completed, f"auto_complete_config of model '{name}'")
    except ConfigError:
        raise
    except (ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"auto_complete_config of model '{name}' returned an invalid config: {exc}") from None
    config.CopyFrom(result)
    config.name = name


def auto_complete_backend_model(config: mc.ModelConfig, model_file: Path, default_max_batch_size: int,
                                timeout: float = AUTO_COMPLETE_TIMEOUT) -> None:
    """Apply the tensor backend's auto_complete_config in a throw-away worker that imports its framework."""
    launch = launch_for(config, model_file.parent.parent)
    message = ("auto_backend", config.backend, config.SerializeToString(), str(model_file), default_max_batch_size)
    completed: bytes = _ask_worker(message, f"the auto-completion of model '{config.name}' by backend "
                                            f"'{config.backend}'", launch, timeout)
    config.ParseFromString(completed)  # the whole config, as the worker's backend left it
