"""naiad.tools imports nothing from the server's internals (only naiad.protocol / naiad.config tables)."""

import json
import subprocess
import sys
from pathlib import Path

import naiad

SOURCE = Path(naiad.__file__).parent
FORBIDDEN = ("naiad.core", "naiad.frontends", "naiad.scheduling", "naiad.runtime", "naiad.backends",
             "naiad.repository", "naiad.observability", "naiad.cli")

PROBE = """
import importlib, json, pkgutil, sys, types
# a bare `naiad` package, so that naiad/__init__.py's own re-exports do not count against the tools
package = types.ModuleType("naiad"); package.__path__ = [sys.argv[1]]; sys.modules["naiad"] = package
import naiad.tools
names = [m.name for m in pkgutil.walk_packages(naiad.tools.__path__, "naiad.tools.")]
for name in names:
    if not name.endswith("torch_source"):
        importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(m for m in sys.modules if m.startswith("naiad."))}))
"""


def test_tools_do_not_import_server_internals():
    done = subprocess.run([sys.executable, "-c", PROBE, str(SOURCE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report["imported"]) >= 25
    leaked = [m for m in report["loaded"] if m.startswith(FORBIDDEN)]
    assert leaked == []
