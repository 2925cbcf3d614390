"""Zero-downtime updates: reloads under continuous traffic fail no request; POLL picks up versions quickly."""

import shutil
import threading
import time

import numpy as np
import tritonclient.http as httpclient

from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server
from tests.support.waiting import wait_until


class Traffic:
    """Sends add_sub requests back to back from a few threads and counts failures."""

    def __init__(self, url: str, threads: int = 3) -> None:
        self.url = url
        self.sent = 0
        self.failures: list[str] = []
        self.versions: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        a = np.ones((1, 16), np.float32)
        deadline = time.monotonic() + 120
        while not self._stop.is_set() and time.monotonic() < deadline:
            inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a)
            try:
                result = client.infer("m", inputs)
                ok = result.as_numpy("OUTPUT0")[0, 0] == 2
                with self._lock:
                    self.sent += 1
                    self.versions.add(result.get_response()["model_version"])
                    if not ok:
                        self.failures.append("wrong answer")
            except Exception as exc:  # every failure is recorded, none may happen
                with self._lock:
                    self.failures.append(str(exc))

    def __enter__(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def test_explicit_reloads_under_load_fail_nothing(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    with start_server(tmp_path, "--model-control-mode=explicit", "--load-model=m") as server:
        control = httpclient.InferenceServerClient(server.http_url)
        with Traffic(server.http_url) as traffic:
            wait_until(lambda: traffic.sent > 20, "traffic to flow", timeout=30)
            shutil.copytree(model_dir / "1", model_dir / "2")  # a new version lands
            control.load_model("m")
            config = (model_dir / "config.pbtxt").read_text()
            (model_dir / "config.pbtxt").write_text(config.replace("count: 1", "count: 2"))  # a changed config
            control.load_model("m")
            control.load_model("m", config='{"backend": "onnxruntime", "max_batch_size": 4}')  # an override
            sent_before = traffic.sent
            wait_until(lambda: traffic.sent > sent_before + 20, "traffic to flow after the reload", timeout=30)
        assert traffic.failures == [] and traffic.sent > 40
        assert traffic.versions == {"1", "2"}
        assert control.get_model_metadata("m")["versions"] == ["2"]


def test_poll_mode_serves_a_new_version_within_two_intervals(tmp_path):
    model_dir = add_sub_model(tmp_path, "m")
    with start_server(tmp_path, "--model-control-mode=poll", "--repository-poll-secs=1") as server:
        control = httpclient.InferenceServerClient(server.http_url)
        with Traffic(server.http_url) as traffic:
            wait_until(lambda: traffic.sent > 20, "traffic to flow", timeout=30)
            shutil.copytree(model_dir / "1", model_dir / "2")
            landed = time.monotonic()
            wait_until(lambda: control.get_model_metadata("m")["versions"] == ["2"], "version 2 to be served", timeout=10)
            elapsed = time.monotonic() - landed
        assert traffic.failures == []
        assert elapsed < 2.0  # under two poll intervals
