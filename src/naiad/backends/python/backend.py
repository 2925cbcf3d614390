"""`backend: "python"`: auto-complete through the model's own staticmethod, one worker process per instance."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import InstanceSpec, ModelSource
from naiad.backends.python.framing import BlockingChannel
from naiad.backends.python.instance import PythonInstance
from naiad.backends.python.launcher import (
    ExecutionEnvError,
    Launch,
    resolve_launch,
    spawn,
)
from naiad.config.model_config import (
    ConfigError,
    config_to_json,
    parameter,
    parse_config_json,
)

log = logging.getLogger("naiad.python")

AUTO_COMPLETE_TIMEOUT = 300.0


def _launch_for(config: mc.ModelConfig, model_dir: Path) -> Launch:
    try:
        return resolve_launch(parameter(config, "EXECUTION_ENV_PATH"), model_dir)
    except (ExecutionEnvError, OSError) as exc:
        raise ConfigError(f"unable to prepare the Python environment of model '{config.name}': {exc}") from None


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
    return reply[1]


class PythonBackend:
    """Triton's Python backend: model.py defines TritonPythonModel; each instance runs in its own process.

    A Python-based backend (`<backend-directory>/<name>/model.py`) is a PythonBackend named `<name>`
    whose `shared_model_file` is that model.py: it runs for every model using the backend, while the
    model's own directory (args["model_repository"], the version directory) only holds data files.
    """

    name = "python"

    def __init__(self, name: str = "python", shared_model_file: Path | None = None) -> None:
        self.name = name
        self.shared_model_file = shared_model_file

    def auto_complete_config(self, config: mc.ModelConfig, model_file: Path, default_max_batch_size: int) -> None:
        """Apply the model's `auto_complete_config` staticmethod (a model.py without one is not spawned for).

        `model_file` is `<version>/<default_model_filename>`; a Python-based backend runs its shared
        model.py instead (the model's file, if any, is data and need not exist).
        """
        if self.shared_model_file is not None:
            code_file = self.shared_model_file
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
        launch = _launch_for(config, model_dir)
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

    async def create_instance_async(self, source: ModelSource, spec: InstanceSpec) -> PythonInstance:
        """Spawn the instance's worker and wait for its initialize; an exception there fails the load."""
        if self.shared_model_file is not None and source.model_file != self.shared_model_file:
            source = dataclasses.replace(source, model_file=self.shared_model_file)
        loop = asyncio.get_running_loop()
        launch = await loop.run_in_executor(None, _launch_for, source.config, source.model_dir)
        verbose = 1 if log.isEnabledFor(logging.DEBUG) else 0
        instance = PythonInstance(source, spec, launch, verbose)
        await instance.start()
        return instance
