"""`--rate-limit=execution_count` in the real server: two models sharing a one-copy resource never overlap."""

import json
import re
import threading
import urllib.error
import urllib.request

from tests.support.onnx_models import add_sub_model, slow_model
from tests.support.servers import start_server
from tests.support.waiting import wait_until

LIMITED_GROUP = 'instance_group [{ kind: KIND_CPU count: 1 rate_limiter { resources [{ name: "R" count: 1 }] } }]'


def _limit(model_dir) -> None:
    path = model_dir / "config.pbtxt"
    text = path.read_text()
    assert "instance_group [{ kind: KIND_CPU count: 1 }]" in text
    path.write_text(text.replace("instance_group [{ kind: KIND_CPU count: 1 }]", LIMITED_GROUP))


def _post(url: str, body: dict, results: list) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            results.append(response.status)
    except urllib.error.HTTPError as err:
        results.append(err.code)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _pending(server, model: str) -> int:
    text = _get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    match = re.search(r'nv_inference_pending_request_count\{[^}]*model="%s"[^}]*\} (\S+)' % model, text)
    return int(float(match.group(1))) if match else 0


def _executions(server, model: str) -> int:
    stats = json.loads(_get(f"http://{server.http_url}/v2/models/{model}/stats"))
    return stats["model_stats"][0]["execution_count"]


def test_models_sharing_a_single_resource_never_execute_together(tmp_path):
    _limit(slow_model(tmp_path, "slow", matmuls=64))
    _limit(add_sub_model(tmp_path, "add_sub"))
    slow_body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    add_body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for n in ("INPUT0", "INPUT1")]}
    results: list[int] = []
    with start_server(tmp_path, "--rate-limit=execution_count") as server:
        base = f"http://{server.http_url}/v2/models"
        threads = [threading.Thread(target=_post, args=(f"{base}/slow/infer", slow_body, results)) for _ in range(2)]
        for t in threads:
            t.start()
        # One slow request executing (holding R), the other queued behind the busy instance.
        wait_until(lambda: _pending(server, "slow") == 1, "the second slow request to queue", timeout=60)
        assert _executions(server, "slow") == 0
        fast = threading.Thread(target=_post, args=(f"{base}/add_sub/infer", add_body, results))
        fast.start()
        threads.append(fast)
        # add_sub's instance is idle, yet its request waits: R is held by the running slow execution.
        wait_until(lambda: _pending(server, "add_sub") == 1, "add_sub to wait for the resource", timeout=60)
        assert _executions(server, "add_sub") == 0
        assert _executions(server, "slow") == 0  # ...and the slow execution is still the one running
        for t in threads:
            t.join(120)
        assert results == [200, 200, 200]
        assert _executions(server, "slow") == 2 and _executions(server, "add_sub") == 1
        assert _pending(server, "slow") == 0 and _pending(server, "add_sub") == 0
