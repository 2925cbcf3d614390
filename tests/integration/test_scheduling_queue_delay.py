"""The real `naiad serve`: with a queue delay, closed-loop clients fill the dynamic batcher's batches."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from tests.support.onnx_models import add_sub_model
from tests.support.servers import RunningServer, start_server

CLIENTS = 32
ROUNDS = 20
# Long enough for 32 Python clients sharing a loaded core with the server to send their next
# requests (measured: 6-12 ms for all 32, more when busier); with 2 ms the clients, not the
# batcher, cap the batch.
DELAY_US = 50_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("queue_delay") / "models"
    add_sub_model(repo, "delayed", dims=16, max_batch_size=CLIENTS,
                  scheduler=f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}")
    with start_server(repo) as running:
        yield running


async def _closed_loop(url: str) -> None:
    """CLIENTS clients, each sending its next request as soon as the previous one was answered."""
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    async with aioclient.InferenceServerClient(url) as client:

        async def one_client() -> None:
            for _ in range(ROUNDS):
                inputs = [aioclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(data)
                result = await client.infer("delayed", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)

        await asyncio.gather(*(one_client() for _ in range(CLIENTS)))


def test_closed_loop_clients_form_full_batches(server: RunningServer) -> None:
    asyncio.run(_closed_loop(server.grpc_url))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics("delayed", as_json=True)["model_stats"][0]
    executions = [int(entry["batch_size"]) for entry in stats["batch_stats"]
                  for _ in range(int(entry["compute_infer"]["count"]))]
    assert sum(executions) == CLIENTS * ROUNDS
    # Requests arriving within the delay of the first one join its batch (Triton's rule);
    # the batch of 32 closes as soon as it is full.
    assert statistics.median(executions) >= 24, stats["batch_stats"]
    assert int(stats["inference_stats"]["success"]["count"]) == CLIENTS * ROUNDS
