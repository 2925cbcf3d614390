"""Limits on concurrent gRPC streams: per connection (--grpc-max-concurrent-streams) and in flight on the
whole server (--grpc-max-concurrent-rpcs)."""

from __future__ import annotations

import queue
import time
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    add_sub_model(root, "add_sub")
    return root


def _inputs():
    tensors = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor in tensors:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return tensors


def _open_stream(client: grpcclient.InferenceServerClient) -> queue.Queue:
    """Start a stream and wait for one answer on it, so the server surely holds the stream open."""
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    client.async_stream_infer("add_sub", _inputs())
    first = results.get(timeout=30)
    assert not isinstance(first, InferenceServerException), first
    return results


def _eventually_live(client: grpcclient.InferenceServerClient, seconds: float = 20.0) -> bool:
    """The server releases a finished stream's slot just after the client sees the stream end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return client.is_server_live(client_timeout=5)
        except InferenceServerException:
            continue
    return False


def test_in_flight_rpcs_over_the_limit_are_resource_exhausted(repo):
    with start_server(repo, "--grpc-max-concurrent-rpcs=1") as server:
        holder = grpcclient.InferenceServerClient(server.grpc_url)
        other = grpcclient.InferenceServerClient(server.grpc_url)
        assert other.is_server_live()  # alone, a call goes through
        _open_stream(holder)
        with pytest.raises(InferenceServerException) as info:
            other.is_server_live(client_timeout=10)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        holder.stop_stream()
        assert _eventually_live(other)
        holder.close()
        other.close()


def test_streams_per_connection_over_the_limit_wait_for_a_free_slot(repo):
    with start_server(repo, "--grpc-max-concurrent-streams=1") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        _open_stream(client)
        # the same connection may not open a second stream while the first is open: the call waits
        with pytest.raises(InferenceServerException) as info:
            client.is_server_live(client_timeout=2)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # another connection is not affected (a local subchannel pool forces a connection of its own)
        other = grpcclient.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        assert other.is_server_live(client_timeout=10)
        client.stop_stream()
        assert _eventually_live(client)
        client.close()
        other.close()
