"""Fixtures shared by the gRPC integration tests: each test module provides its own `server`."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.support.servers import RunningServer


@pytest.fixture()
def grpc_client(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient.grpc on the module's server."""
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture()
def stub(server: RunningServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """The raw generated stub, for requests tritonclient will not send."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)
