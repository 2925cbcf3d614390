"""`backend: "python"`: Triton's Python backend, whose model.py runs in one worker process per instance.

The process runtime (`naiad.runtime.process`) does the work: it hosts model.py in each instance's
worker (`python_host.py`), restarts a worker that dies, and runs `auto_complete_config` in a
throw-away worker. This class tells the server which models are Python models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal


class PythonBackend:
    """Triton's Python backend: model.py defines TritonPythonModel; each instance runs in its own process.

    A Python-based backend (`<backend-directory>/<name>/model.py`) is a PythonBackend named `<name>`
    whose `shared_model_file` is that model.py: it runs for every model using the backend, while the
    model's own directory (args["model_repository"], the version directory) only holds data files.
    """

    kind: Literal["process"] = "process"
    host: Literal["python", "backend"] = "python"

    def __init__(self, name: str = "python", shared_model_file: Path | None = None) -> None:
        self.name = name
        self.shared_model_file = shared_model_file
