"""HTTP JSON load through `wrk` (closed loop, one connection per client, keep-alive).

    python benchmarks/wrk_load.py --url 127.0.0.1:8000 --model add_sub -c 8 --duration 5

wrk posts the same KServe v2 JSON body (load.py's workload for the model) on every connection
and a Lua `done()` hook prints wrk's own latency histogram as JSON: percentiles in microseconds
(p50, p90, p99, p99.9), requests, and the error counts (connect, read, write, timeout, non-2xx).
A first run of --warmup seconds is discarded. wrk runs pinned with `taskset -c CORE` when --core
is given. Debian/Ubuntu: `apt-get install wrk`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load

RESULT_TAG = "WRK_RESULT "
LUA_TEMPLATE = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{tag}{{"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,'
    .. '"status_errors":%d,"timeout_errors":%d,"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,'
    .. '"p999_us":%.1f,"mean_us":%.1f,"max_us":%.1f}}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.mean, latency.max))
end
"""


def lua_script(body: bytes) -> str:
    text = body.decode()
    if "]==]" in text:
        raise ValueError("the JSON body contains the Lua long-bracket terminator")
    return LUA_TEMPLATE.format(body=text, tag=RESULT_TAG)


def json_body(model: str) -> bytes:
    """The KServe v2 JSON request body load.py sends for `model` (batch 1)."""
    request = load.http_request_bytes(load.make_workload(model), "127.0.0.1", 0, binary=False)
    return request.split(b"\r\n\r\n", 1)[1]


def _wrk(core: str | None, script: Path, url: str, concurrency: int, seconds: float) -> dict:
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "10s",
           "-s", str(script), url]
    if core is not None:
        cmd = ["taskset", "-c", core, *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise RuntimeError(f"wrk exited {done.returncode} without a result: {(done.stderr or done.stdout)[-300:]}")


def run_wrk(port: int, model: str, concurrency: int, duration: float, warmup: float = 1.0,
            core: str | None = None) -> dict:
    """Throughput and latency in load.py's LoadResult fields (plus p999_ms and wrk's error counts)."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    with tempfile.TemporaryDirectory(prefix="wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(json_body(model)))
        if warmup > 0:
            _wrk(core, script, url, concurrency, warmup)
        raw = _wrk(core, script, url, concurrency, duration)
    errors = sum(raw[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeout_errors"))
    window = raw["duration_us"] / 1e6
    ok = raw["requests"] - raw["status_errors"]
    result = {"protocol": "http-json", "model": model, "concurrency": concurrency, "completed": ok,
              "errors": errors, "infer_per_sec": ok / window if window > 0 else 0.0,
              "p50_ms": raw["p50_us"] / 1e3, "p90_ms": raw["p90_us"] / 1e3, "p99_ms": raw["p99_us"] / 1e3,
              "p999_ms": raw["p999_us"] / 1e3, "mean_ms": raw["mean_us"] / 1e3, "window_s": window,
              "client": "wrk", "wrk": raw}
    if errors:
        result["error"] = (f"{errors} wrk errors (connect {raw['connect_errors']}, read {raw['read_errors']}, "
                           f"write {raw['write_errors']}, timeout {raw['timeout_errors']}, "
                           f"non-2xx {raw['status_errors']})")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="127.0.0.1:PORT")
    parser.add_argument("--model", default="add_sub")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--core", help="pin wrk to this core (taskset -c)")
    args = parser.parse_args(argv)
    host, _, port = args.url.rpartition(":")
    if host not in ("", "127.0.0.1", "localhost"):
        parser.error("only loopback targets (127.0.0.1)")
    print(json.dumps(run_wrk(int(port), args.model, args.concurrency, args.duration, args.warmup, args.core)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
