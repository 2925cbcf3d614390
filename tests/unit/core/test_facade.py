"""The facade's interfaces on a real Server: shared memory resolved in the core, one model lookup per
request through the real HTTP and gRPC frontends, the caller's config left alone."""

import asyncio
import pickle
import urllib.error
import urllib.request
from multiprocessing import shared_memory as mp_shm

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import naiad
from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.server import GrpcFrontend
from naiad.frontends.http.server import HttpFrontend
from naiad.protocol.errors import DecoupledModelError, ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest, InferInput, RequestedOutput, SharedMemoryRef
from tests.support.onnx_models import add_sub_model


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "add_sub")
    return root


@pytest.fixture(scope="module")
def server(repo):
    with naiad.Server(model_repository=str(repo)) as srv:
        yield srv


def _post(url, body):
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _call(server, coroutine):
    return asyncio.run_coroutine_threadsafe(coroutine, server._loop).result(30)


@pytest.fixture
def region():
    block = mp_shm.SharedMemory(create=True, size=256)
    try:
        yield block
    finally:
        block.close()
        block.unlink()


def test_shared_memory_inputs_and_outputs_are_resolved_in_the_core(server, region):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.float32)
    region.buf[:64] = a.tobytes()
    server.shared_memory.register("facade_io", region.name, 0, 256)
    try:
        request = InferenceRequest(
            model_name="add_sub",
            inputs=[InferInput("INPUT0", "FP32", (1, 16), None, shared_memory=SharedMemoryRef("facade_io", 64, 0)),
                    InferInput("INPUT1", "FP32", (1, 16), b)],
            outputs=[RequestedOutput("OUTPUT0", shared_memory=SharedMemoryRef("facade_io", 64, 128)),
                     RequestedOutput("OUTPUT1")],
        )
        response = _call(server, server.inference.infer(request))
        assert response.output("OUTPUT0").data is None  # written to the region
        np.testing.assert_array_equal(np.frombuffer(region.buf[128:192], np.float32).reshape(1, 16), a + b)
        np.testing.assert_array_equal(response.output("OUTPUT1").data, a - b)
        assert server.shared_memory.status("facade_io")[0]["byte_size"] == 256
    finally:
        server.shared_memory.unregister("facade_io")


def test_unknown_region_is_a_clear_error_and_the_server_keeps_serving(server):
    request = InferenceRequest(
        model_name="add_sub",
        inputs=[InferInput("INPUT0", "FP32", (1, 16), None, shared_memory=SharedMemoryRef("nowhere", 64, 0)),
                InferInput("INPUT1", "FP32", (1, 16), np.ones((1, 16), np.float32))],
    )
    with pytest.raises(NaiadError) as info:
        _call(server, server.inference.infer(request))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == "Unable to find shared memory region: 'nowhere'"
    out = server.infer("add_sub", {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)})
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 16), 2, np.float32))


def test_shared_memory_input_refused_when_client_shm_is_off(repo):
    with naiad.Server(model_repository=str(repo), allow_client_shm=False) as srv:
        request = InferenceRequest(
            model_name="add_sub",
            inputs=[InferInput("INPUT0", "FP32", (1, 16), None, shared_memory=SharedMemoryRef("r", 64, 0)),
                    InferInput("INPUT1", "FP32", (1, 16), np.ones((1, 16), np.float32))],
        )
        with pytest.raises(NaiadError) as info:
            _call(srv, srv.inference.infer(request))
        assert info.value.code is ErrorCode.UNSUPPORTED
        assert "--allow-client-shm=true" in info.value.message


def test_server_leaves_the_callers_config_alone(repo):
    config = ServerConfig()
    before = repr(config)
    server = naiad.Server(config, model_repository=str(repo), log_verbose=2, allow_client_shm=False)
    assert repr(config) == before
    assert server.config is not config
    assert server.config.model_repositories == [str(repo)] and server.config.log_verbose == 2


def test_one_model_lookup_per_request_through_http_and_grpc(server):
    lookups = []
    real_lookup = server.models.lookup

    def counting(name, version=""):
        lookups.append(name)
        return real_lookup(name, version)

    http = HttpFrontend(server, "127.0.0.1", 0)
    grpc_frontend = GrpcFrontend(server, "127.0.0.1", 0)
    http_port = _call(server, http.start())
    grpc_port = _call(server, grpc_frontend.start())
    server.models.lookup = counting
    try:
        a = np.ones((1, 16), np.float32)
        with httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as client:
            inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for each in inputs:
                each.set_data_from_numpy(a, binary_data=True)
            lookups.clear()
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            assert lookups == ["add_sub"]
            with pytest.raises(InferenceServerException) as info:
                client.infer("no_such_model", inputs)
            assert info.value.status() == "404"
        # A body that does not decode: a 404 for a model that does not exist, a 400 for one that does.
        for model, status in (("no_such_model", 404), ("add_sub", 400)):
            code, body = _post(f"http://127.0.0.1:{http_port}/v2/models/{model}/infer", b'{"inputs": [')
            assert code == status, body
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for each in inputs:
                each.set_data_from_numpy(a)
            lookups.clear()
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)
            assert lookups == ["add_sub"]
        finally:
            client.close()
    finally:
        server.models.lookup = real_lookup
        _call(server, grpc_frontend.stop())
        _call(server, http.stop())


def test_facade_values_cross_a_process_boundary(server):
    """What the interfaces take and give pickles: a frontend in another process can be handed them."""
    request = InferenceRequest(
        model_name="add_sub", id="r1",
        inputs=[InferInput("INPUT0", "FP32", (1, 16), None, shared_memory=SharedMemoryRef("reg", 64, 8)),
                InferInput("INPUT1", "FP32", (1, 16), np.ones((1, 16), np.float32))],
        outputs=[RequestedOutput("OUTPUT0", classification=2)],
    )
    copy = pickle.loads(pickle.dumps(request))
    assert copy.inputs[0].shared_memory == SharedMemoryRef("reg", 64, 8) and copy.inputs[0].data is None
    np.testing.assert_array_equal(copy.inputs[1].data, request.inputs[1].data)
    assert copy.outputs == request.outputs
    for error in (NaiadError(ErrorCode.NOT_FOUND, "gone"), DecoupledModelError("dec")):
        again = pickle.loads(pickle.dumps(error))
        assert (type(again), again.code, again.message) == (type(error), error.code, error.message)
    for value in (server.info.metadata(), server.info.model_metadata("add_sub"), server.info.model_config_dict("add_sub"),
                  server.info.model_statistics("add_sub"), server.control.repository_index(), server.shared_memory.status()):
        assert pickle.loads(pickle.dumps(value)) == value
