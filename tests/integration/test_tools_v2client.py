"""The tools' control-plane client against the real server, over HTTP and gRPC: typed model facts, statistics,
repository load with a config override, system shared memory, and the server's own error messages."""

import json
import socket
from multiprocessing import shared_memory

import numpy as np
import pytest

from naiad.tools.v2client import ControlClient, HttpControl, ServerError, control_client, model_info
from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    add_sub_model(repo, "add_sub", dims=4, max_batch_size=8)
    with start_server(repo, "--model-control-mode", "explicit", "--load-model", "add_sub") as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def control(request, server):
    client = control_client(request.param, server.grpc_url if request.param == "grpc" else server.http_url, 30.0)
    yield client
    client.close()


def test_model_info_is_typed_the_same_over_both_protocols(control: ControlClient):
    assert control.ready() and control.model_ready("add_sub") and not control.model_ready("absent")
    info = model_info(control, "add_sub")
    assert (info.name, info.version, info.max_batch_size, info.decoupled) == ("add_sub", "1", 8, False)
    assert [(s.name, s.datatype, s.shape) for s in info.inputs] == [("INPUT0", "FP32", [-1, 4]),
                                                                    ("INPUT1", "FP32", [-1, 4])]
    assert all(isinstance(d, int) for s in info.outputs for d in s.shape)


def test_server_errors_carry_the_servers_message_and_the_server_keeps_serving(control: ControlClient):
    with pytest.raises(ServerError, match="model 'absent' metadata: .*absent"):
        control.metadata("absent")
    with pytest.raises(ServerError, match="load model 'absent': .*absent"):
        control.load("absent")
    with pytest.raises(ServerError, match="register system shared memory 'nowhere': "):
        control.register_system_shm("nowhere", "/naiad_no_such_segment", 64)
    assert control.model_ready("add_sub")


def test_load_with_a_config_override_unload_and_load_from_the_repository(control: ControlClient):
    config = control.config("add_sub")
    override = {**config, "max_batch_size": 2}
    override.pop("dynamic_batching", None)
    control.load("add_sub", json.dumps(override))
    try:
        assert control.config("add_sub")["max_batch_size"] == 2 and control.model_ready("add_sub")
    finally:
        control.unload("add_sub")  # an override stays in force across reloads until the model is unloaded
        control.load("add_sub")
    assert control.config("add_sub")["max_batch_size"] == 8 and control.model_ready("add_sub")


def test_system_shared_memory_register_and_unregister(control: ControlClient):
    segment = shared_memory.SharedMemory(create=True, size=64)
    try:
        control.register_system_shm("tool_region", "/" + segment.name, 64)
        assert control.system_shm_regions() == ["tool_region"]
        control.unregister_system_shm("tool_region")
        assert control.system_shm_regions() == []
    finally:
        segment.close()
        segment.unlink()


def test_statistics_count_an_inference(server):
    control = HttpControl(server.http_url)
    try:
        before = control.stats("add_sub")
        a, b = np.ones((1, 4), np.float32), np.full((1, 4), 2.0, np.float32)
        answer = control.infer_json("add_sub", [("INPUT0", "FP32", a), ("INPUT1", "FP32", b)])
        assert answer["OUTPUT0"].tolist() == [[3.0] * 4] and answer["OUTPUT1"].tolist() == [[-1.0] * 4]
        assert control.stats("add_sub").minus(before).success_count == 1
    finally:
        control.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unreachable_server_is_not_ready(protocol):
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = control_client(protocol, f"127.0.0.1:{port}", 5.0)
    try:
        assert not client.ready() and not client.model_ready("add_sub")
        with pytest.raises((ServerError, OSError)):
            client.stats("add_sub")
    finally:
        client.close()
