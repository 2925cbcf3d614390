"""A Python model's auto_complete_config, run in a throw-away worker (model code never runs in the server)."""

from __future__ import annotations

import json
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.config.model_config import ConfigError, config_to_json, parse_config_json
from naiad.runtime.process.framing import BlockingChannel
from naiad.runtime.process.launcher import Launch, launch_for, spawn

AUTO_COMPLETE_TIMEOUT = 300.0


def run_auto_complete(config_json: str, model_file: Path, launch: Launch, timeout: float = AUTO_COMPLETE_TIMEOUT) -> str | None:
    """Run TritonPythonModel.auto_complete_config in a throw-away worker; the completed config JSON, or None."""
    process, sock = spawn(launch)
    try:
        sock.settimeout(timeout)
        channel = BlockingChannel(sock)
        channel.send(("auto", config_json, str(model_file)))
        try:
            reply = channel.receive()
        except TimeoutError:
            raise ConfigError(f"auto_complete_config of '{model_file}' did not finish within {timeout:.0f}s") from None
        except (EOFError, OSError):
            process.wait()
            raise ConfigError(
                f"the Python worker running auto_complete_config of '{model_file}' exited (code {process.returncode}); "
                "see the server log for its output"
            ) from None
    finally:
        sock.close()
        try:
            process.wait(timeout=10)
        except Exception:  # a worker that does not end is killed
            process.kill()
            process.wait()
    if reply[0] == "auto_error":
        raise ConfigError(f"Internal: {reply[1]}")
    completed: str | None = reply[1]
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
