"""The gRPC service in-process against a fake Server facade, driven by tritonclient.grpc and raw stubs."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from naiad.config.server_config import ServerConfig
from naiad.frontends.grpc.server import GrpcFrontend
from naiad.protocol.errors import (
    DecoupledModelError,
    ErrorCode,
    NaiadError,
    internal,
    invalid_arg,
    not_found,
    unsupported,
)
from naiad.protocol.types import InferenceRequest, InferenceResponse, OutputTensor

WAIT = 10.0
MODELS = ("echo", "gate", "dec", "unhealthy")


class FakeShm:
    """Records calls; refuses like the real registry would."""

    def __init__(self) -> None:
        self.regions: dict[str, dict] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self.regions:
            raise NaiadError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        self.regions[name] = {"name": name, "key": key, "offset": offset, "byte_size": byte_size}

    def unregister(self, name: str = "") -> None:
        if name:
            self.regions.pop(name, None)
        else:
            self.regions.clear()

    def status(self, name: str = "") -> list[dict]:
        if name:
            if name not in self.regions:
                raise invalid_arg(f"Unable to find system shared memory region: '{name}'")
            return [self.regions[name]]
        return list(self.regions.values())

    def read_tensor(self, ref: Any, datatype: str, shape: tuple[int, ...], input_name: str) -> np.ndarray:
        if ref.region not in self.regions:
            raise invalid_arg(f"Unable to find shared memory region: '{ref.region}'")
        return np.full(shape, 7, dtype=np.int32)

    def cuda_status(self, name: str = "") -> list[dict]:
        return []

    def cuda_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        raise unsupported("CUDA shared memory is not supported")

    def cuda_unregister(self, name: str = "") -> None:
        return None


class FakeServer:
    """Models: echo (outputs OUT_<input> = input), gate (waits for another key), dec (decoupled)."""

    def __init__(self, allow_client_shm: bool = True) -> None:
        self.config = ServerConfig(allow_client_shm=allow_client_shm, exit_timeout_secs=1.0,
                                   grpc_server_impl=os.environ.get("NAIAD_TEST_GRPC_IMPL", ServerConfig.grpc_server_impl))
        self.shared_memory = FakeShm()
        self.inference = self.control = self.info = self  # the facade's interfaces, all in this one fake
        self.seen: list[InferenceRequest] = []
        self.cancelled: queue.Queue[str] = queue.Queue()
        self.loads: list[tuple] = []
        self.unloads: list[tuple] = []
        self._gates: dict[str, asyncio.Event] = {}
        self._seen_changed = threading.Condition()

    def wait_seen(self, request_id: str) -> None:
        """Block until a request with this id reached the core."""
        with self._seen_changed:
            assert self._seen_changed.wait_for(lambda: any(r.id == request_id for r in self.seen), WAIT)

    def _check(self, name: str, version: str) -> None:
        if name not in MODELS:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version not in ("", "1"):
            raise not_found(f"Request for unknown model: '{name}' version {version} is not found")

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return True

    def metadata(self) -> dict:
        return {"name": "triton", "version": "2.51.0", "extensions": ["classification", "sequence"]}

    def model_ready(self, name: str, version: str = "") -> bool:
        self._check(name, version)
        return name != "unhealthy"

    def check_servable(self, name: str, version: str = "") -> None:
        self._check(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict:
        self._check(name, version)
        return {
            "name": name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        self._check(name, version)
        config = mc.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=8)
        config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4])
        config.model_transaction_policy.decoupled = name == "dec"
        return config

    def is_decoupled(self, name: str, version: str = "") -> bool:
        self._check(name, version)
        return name == "dec"

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        self._check(request.model_name, request.model_version)
        for inp in request.inputs:  # as the core does: read inputs sent by shared-memory reference
            if inp.data is None:
                inp.data = self.shared_memory.read_tensor(inp.shared_memory, inp.datatype, inp.shape, inp.name)
        with self._seen_changed:
            self.seen.append(request)
            self._seen_changed.notify_all()
        if request.model_name == "dec":
            raise DecoupledModelError("dec")
        if request.parameters.get("fail"):
            raise internal(f"model failed: {request.parameters['fail']}")
        if request.model_name == "gate":
            return await self._gate(request)
        outputs = []
        wanted = {o.name: o for o in request.outputs}
        for inp in request.inputs:
            name = f"OUT_{inp.name}"
            if wanted and name not in wanted:
                continue
            ref = wanted[name].shared_memory if wanted else None
            if ref is not None:
                outputs.append(OutputTensor(name, inp.datatype, inp.shape, None))
            else:
                outputs.append(OutputTensor(name, inp.datatype, inp.shape, inp.data))
        for out in request.outputs:
            if out.name not in {o.name for o in outputs}:
                raise invalid_arg(f"unexpected inference output '{out.name}' for model '{request.model_name}'")
        return InferenceResponse(
            request.model_name, "1", outputs, id=request.id, parameters={"echo_id": request.id or "none"}
        )

    async def infer_stream(self, request: InferenceRequest, errors_inline: bool = False) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """dec: COUNT responses (INT32 value i), then a flag-only final; others: one final response."""
        self._check(request.model_name, request.model_version)
        if request.model_name != "dec":
            yield await self.infer_async(request), True
            return
        with self._seen_changed:
            self.seen.append(request)
            self._seen_changed.notify_all()
        count = int(request.inputs[0].data.ravel()[0])
        if count < 0:
            raise invalid_arg(f"negative count {count}")
        for i in range(count):
            out = OutputTensor("OUT", "INT32", (1,), np.array([i], dtype=np.int32))
            yield InferenceResponse("dec", "1", [out], id=request.id), False
            await asyncio.sleep(0)
        yield None, True

    async def _gate(self, request: InferenceRequest) -> InferenceResponse:
        """Input KEY (BYTES) completes only after input AFTER's key completed ('' = immediately)."""
        key = request.inputs[0].data.ravel()[0].decode()
        after = request.inputs[1].data.ravel()[0].decode()
        try:
            if after:
                await self._gates.setdefault(after, asyncio.Event()).wait()
        except asyncio.CancelledError:
            self.cancelled.put(key)
            raise
        self._gates.setdefault(key, asyncio.Event()).set()
        out = np.array([key.encode()], dtype=np.object_)
        return InferenceResponse("gate", "1", [OutputTensor("KEY_OUT", "BYTES", (1,), out)], id=request.id)

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        entries = [
            {"name": "echo", "version": "1", "state": "READY"},
            {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "bad model"},
            {"name": "never"},
        ]
        return [e for e in entries if e.get("state") == "READY"] if ready_only else entries

    async def load_model(self, name: str, config_json: str | None = None, files: dict | None = None) -> None:
        if name == "missing":
            raise internal(f"failed to load '{name}', failed to poll from model repository")
        self.loads.append((name, config_json, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.unloads.append((name, unload_dependents))

    def model_statistics(self, name: str = "", version: str = "") -> dict:
        if name and name not in MODELS:
            raise invalid_arg(f"requested model '{name}' is not available")
        return {
            "model_stats": [
                {
                    "name": "echo",
                    "version": "1",
                    "last_inference": 1700000000000,
                    "inference_count": 6,
                    "execution_count": 2,
                    "inference_stats": {"success": {"count": 6, "ns": 1234}, "fail": {"count": 0, "ns": 0}},
                    "response_stats": {"0": {"success": {"count": 1, "ns": 5}}},
                    "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 2, "ns": 4500}}],
                    "memory_usage": [],
                }
            ]
        }

    infer = infer_async  # InferenceAPI's names
    stream = infer_stream


class Running:
    def __init__(self, fake: FakeServer, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.fake = fake
        self.url = url
        self.loop = loop


def _serve(fake: FakeServer) -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    frontend = GrpcFrontend(fake, "127.0.0.1", 0)
    port = asyncio.run_coroutine_threadsafe(frontend.start(), loop).result(WAIT)
    try:
        yield Running(fake, f"127.0.0.1:{port}", loop)
    finally:
        asyncio.run_coroutine_threadsafe(frontend.stop(), loop).result(WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT)
        loop.close()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    yield from _serve(FakeServer())


@pytest.fixture(scope="module")
def no_shm() -> Iterator[Running]:
    yield from _serve(FakeServer(allow_client_shm=False))


@pytest.fixture()
def client(running: Running) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(running.url)
    yield c
    c.close()


@pytest.fixture()
def stub(running: Running) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(running.url)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def _client_error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


# ---------------------------------------------------------------- health, metadata, config


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    assert client.is_model_ready("echo") is True
    assert client.is_model_ready("unhealthy") is False
    meta = client.get_server_metadata(as_json=True)
    assert meta == {"name": "triton", "version": "2.51.0", "extensions": ["classification", "sequence"]}
    model = client.get_model_metadata("echo", as_json=True)
    assert model["platform"] == "onnxruntime_onnx" and model["versions"] == ["1"]
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]


def test_unknown_model_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("nope") is False  # Triton 2.51: OK with ready=false
    err = _client_error(client.get_model_metadata, "echo", "9")
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'echo' version 9 is not found"
    err = _client_error(client.get_model_config, "nope")
    assert err.status() == "StatusCode.NOT_FOUND"


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("echo", as_json=True)
    assert config["config"]["name"] == "echo"
    assert config["config"]["max_batch_size"] == 8
    assert config["config"]["input"][0]["data_type"] == "TYPE_FP32"
    proto = client.get_model_config("dec")
    assert proto.config.model_transaction_policy.decoupled is True


def test_statistics(client: grpcclient.InferenceServerClient, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    stats = client.get_inference_statistics("echo")
    (model,) = stats.model_stats
    assert (model.name, model.version, model.inference_count, model.execution_count) == ("echo", "1", 6, 2)
    assert model.last_inference == 1700000000000
    assert model.inference_stats.success.count == 6 and model.inference_stats.success.ns == 1234
    assert model.response_stats["0"].success.count == 1
    assert model.batch_stats[0].compute_infer.ns == 4500
    err = _client_error(client.get_inference_statistics, "nope")
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert err.message() == "requested model 'nope' is not available"


# ---------------------------------------------------------------- repository


def test_repository_index_and_load_unload(running: Running, client: grpcclient.InferenceServerClient,
                                          stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index[1] == {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "bad model"}
    assert index[2] == {"name": "never"}
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert [m.name for m in ready.models] == ["echo"]
    err = _rpc_error(stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="other"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "'repository_name' specification is not supported"

    client.load_model("echo", config='{"max_batch_size": 4}', files={"file:1/model.onnx": b"\x00\x01binary"})
    assert running.fake.loads[-1] == ("echo", '{"max_batch_size": 4}', {"file:1/model.onnx": b"\x00\x01binary"})
    client.load_model("plain")
    assert running.fake.loads[-1] == ("plain", None, None)
    err = _client_error(client.load_model, "missing")
    assert err.status() == "StatusCode.INTERNAL"
    assert err.message() == "failed to load 'missing', failed to poll from model repository"
    bad = pb.RepositoryModelLoadRequest(model_name="echo")
    bad.parameters["config"].bool_param = True
    err = _rpc_error(stub.RepositoryModelLoad, bad)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "invalid value type for load parameter 'config', expected string_param."
    bad = pb.RepositoryModelLoadRequest(model_name="echo")
    bad.parameters["file:1/model.onnx"].string_param = "not bytes"
    err = _rpc_error(stub.RepositoryModelLoad, bad)
    assert err.details() == "invalid value type for load parameter 'file:1/model.onnx', expected bytes_param."

    client.unload_model("echo", unload_dependents=True)
    client.unload_model("echo")
    assert running.fake.unloads[-2:] == [("echo", True), ("echo", False)]
    bad_unload = pb.RepositoryModelUnloadRequest(model_name="echo")
    bad_unload.parameters["unload_dependents"].string_param = "yes"
    err = _rpc_error(stub.RepositoryModelUnload, bad_unload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "invalid value type for 'unload_dependents' parameter, expected bool_param."
    err = _rpc_error(stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(repository_name="r", model_name="x"))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


# ---------------------------------------------------------------- shared memory


def test_system_shared_memory_calls(client: grpcclient.InferenceServerClient) -> None:
    client.unregister_system_shared_memory()
    client.register_system_shared_memory("r0", "/naiad_unit_r0", 64, offset=8)
    status = client.get_system_shared_memory_status(as_json=True)
    assert status["regions"]["r0"] == {"name": "r0", "key": "/naiad_unit_r0", "offset": "8", "byte_size": "64"}
    err = _client_error(client.register_system_shared_memory, "r0", "/naiad_unit_r0", 64)
    assert err.status() == "StatusCode.ALREADY_EXISTS"
    assert err.message() == "shared memory region 'r0' already in manager"
    err = _client_error(client.get_system_shared_memory_status, "zz")
    assert err.message() == "Unable to find system shared memory region: 'zz'"
    client.unregister_system_shared_memory("r0")
    assert client.get_system_shared_memory_status(as_json=True) == {}


def test_shared_memory_infer_input_and_output(client: grpcclient.InferenceServerClient) -> None:
    client.register_system_shared_memory("in_r", "/naiad_unit_in", 64)
    try:
        inp = grpcclient.InferInput("A", [2], "INT32")
        inp.set_shared_memory("in_r", 8)
        plain = _input("B", np.array([1, 2], dtype=np.int8), "INT8")
        out_a = grpcclient.InferRequestedOutput("OUT_A")
        out_a.set_shared_memory("in_r", 8, offset=16)
        out_b = grpcclient.InferRequestedOutput("OUT_B")
        result = client.infer("echo", [inp, plain], outputs=[out_a, out_b])
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUT_A", "OUT_B"]
        assert response.raw_output_contents[0] == b""
        assert len(response.outputs[0].parameters) == 0
        assert result.as_numpy("OUT_B").tolist() == [1, 2]
    finally:
        client.unregister_system_shared_memory("in_r")


def test_shared_memory_disabled(no_shm: Running) -> None:
    with grpcclient.InferenceServerClient(no_shm.url) as c:
        err = _client_error(c.register_system_shared_memory, "r", "/k", 8)
        assert err.status() == "StatusCode.UNIMPLEMENTED"
        assert err.message() == (
            "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
        )
        assert c.get_system_shared_memory_status(as_json=True) == {}
        inp = grpcclient.InferInput("A", [2], "INT32")
        inp.set_shared_memory("r", 8)
        err = _client_error(c.infer, "echo", [inp])
        assert err.status() == "StatusCode.UNIMPLEMENTED" and "Client shared memory is disabled" in err.message()


def test_cuda_shared_memory(client: grpcclient.InferenceServerClient, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest()).regions == {}
    err = _rpc_error(
        stub.CudaSharedMemoryRegister,
        pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=b"h", device_id=0, byte_size=8),
    )
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "CUDA shared memory is not supported"
    stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name=""))


# ---------------------------------------------------------------- unary infer


def test_infer_numeric_bytes_fp16(running: Running, client: grpcclient.InferenceServerClient) -> None:
    arrays = {
        "F": (np.arange(8, dtype=np.float32).reshape(2, 4), "FP32"),
        "H": (np.array([[0.5, -1.25]], dtype=np.float16), "FP16"),
        "S": (np.array([["a", "bc"], ["", "\u00e9"]], dtype=np.object_), "BYTES"),
        "B": (np.array([True, False]), "BOOL"),
        "U": (np.array([2**64 - 1], dtype=np.uint64), "UINT64"),
    }
    inputs = [_input(n, a, d) for n, (a, d) in arrays.items()]
    result = client.infer("echo", inputs, request_id="req-1", parameters={"custom": "v", "n": 3})
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("req-1", "echo", "1")
    assert response.parameters["echo_id"].string_param == "req-1"
    assert len(response.raw_output_contents) == 5
    for name, (array, datatype) in arrays.items():
        out = result.as_numpy(f"OUT_{name}")
        if datatype == "BYTES":
            assert out.tolist() == [[b"a", b"bc"], [b"", "\u00e9".encode()]]
        else:
            assert out.dtype == array.dtype
            np.testing.assert_array_equal(out, array)
        assert result.get_output(f"OUT_{name}").datatype == datatype
    assert running.fake.seen[-1].parameters == {"custom": "v", "n": 3}


def test_infer_request_parameters_reach_core(running: Running, client: grpcclient.InferenceServerClient) -> None:
    inp = _input("X", np.zeros(1, dtype=np.int32), "INT32")
    client.infer("echo", [inp], sequence_id=77, sequence_start=True, sequence_end=True, priority=3, timeout=9000)
    seen = running.fake.seen[-1]
    assert (seen.sequence_id, seen.sequence_start, seen.sequence_end) == (77, True, True)
    assert (seen.priority, seen.timeout_us) == (3, 9000)
    client.infer("echo", [inp], sequence_id="corr", sequence_start=True)
    assert running.fake.seen[-1].sequence_id == "corr"


def test_infer_typed_contents_via_stub(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.ModelInferRequest(model_name="echo", id="typed")
    tensor = request.inputs.add(name="X", datatype="INT16", shape=[3])
    tensor.contents.int_contents.extend([-2, 0, 300])
    strings = request.inputs.add(name="S", datatype="BYTES", shape=[1, 2])
    strings.contents.bytes_contents.extend([b"p", b"q"])
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["OUT_X", "OUT_S"]
    assert all(not o.HasField("contents") for o in response.outputs)
    assert np.frombuffer(response.raw_output_contents[0], dtype="<i2").tolist() == [-2, 0, 300]
    assert response.raw_output_contents[1] == b"\x01\x00\x00\x00p\x01\x00\x00\x00q"


def test_infer_errors_and_messages(client: grpcclient.InferenceServerClient, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    err = _client_error(client.infer, "dec", [_input("X", np.zeros(1, np.int32), "INT32")])
    assert err.status() == "StatusCode.UNIMPLEMENTED"
    assert err.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    err = _client_error(client.infer, "nope", [_input("X", np.zeros(1, np.int32), "INT32")])
    assert err.status() == "StatusCode.NOT_FOUND"
    err = _client_error(client.infer, "echo", [_input("X", np.zeros(1, np.int32), "INT32")], parameters={"fail": "boom"})
    assert err.status() == "StatusCode.INTERNAL" and err.message() == "model failed: boom"

    mixed = pb.ModelInferRequest(model_name="echo", raw_input_contents=[b"\0" * 4])
    mixed.inputs.add(name="A", datatype="INT32", shape=[1])
    b = mixed.inputs.add(name="B", datatype="INT32", shape=[1])
    b.contents.int_contents.append(1)
    err = _rpc_error(stub.ModelInfer, mixed)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "contents field must not be specified when using raw_input_contents for 'B' for model 'echo'"

    reserved = pb.ModelInferRequest(model_name="echo", raw_input_contents=[b"\0"])
    reserved.inputs.add(name="A", datatype="INT8", shape=[1])
    reserved.parameters["triton_final_response"].bool_param = True
    err = _rpc_error(stub.ModelInfer, reserved)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
        "starting with 'triton_' are allowed: triton_enable_empty_final_response"
    )


def _hostile_requests() -> list[tuple[pb.ModelInferRequest, str]]:
    cases: list[tuple[pb.ModelInferRequest, str]] = []

    def req(raw: list[bytes], *tensors: tuple[str, str, list[int]]) -> pb.ModelInferRequest:
        r = pb.ModelInferRequest(model_name="echo", raw_input_contents=raw)
        for name, datatype, shape in tensors:
            r.inputs.add(name=name, datatype=datatype, shape=shape)
        return r

    cases.append((req([b"\0" * 16], ("A", "FP32", [2**40, 2**40])), "unexpected total byte size 16 for input 'A'"))
    cases.append((req([b"\0" * 16], ("A", "BYTES", [2**62])), "unexpected number of string elements"))
    cases.append((req([b"\x10\0\0\0ab"], ("A", "BYTES", [1])), "element byte size 16 for input 'A' exceeds"))
    cases.append((req([b"\0"], ("A", "NOPE", [1])), "invalid datatype 'NOPE' for input 'A'"))
    cases.append((req([b"\0"], ("A", "INT8", [-5])), "non-negative"))
    cases.append((req([b"\0", b"\0"], ("A", "INT8", [1])), "expected 1 raw_input_contents entries"))
    cases.append((req([b"\0"], ("A", "INT8", [1]), ("B", "INT8", [1])), "expected 2 raw_input_contents entries"))
    cases.append((req([b"\0"], ("A", "INT8", [1] * 80)), "invalid input tensor for model 'echo'"))
    typed = req([], ("A", "INT32", [2**62, 2**62]))
    typed.inputs[0].contents.int_contents.append(1)
    cases.append((typed, "unexpected number of elements 1 in contents of input 'A'"))
    half = req([], ("A", "FP16", [1]))
    half.inputs[0].contents.fp32_contents.append(1.0)
    cases.append((half, "FP16 data for input 'A' for model 'echo' must be sent in raw_input_contents"))
    return cases


def test_hostile_storm_then_good_request(client: grpcclient.InferenceServerClient,
                                         stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for _ in range(5):
        for request, expected in _hostile_requests():
            err = _rpc_error(stub.ModelInfer, request)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            assert expected in err.details()
    result = client.infer("echo", [_input("X", np.array([5], dtype=np.int64), "INT64")])
    assert result.as_numpy("OUT_X").tolist() == [5]


def test_undecodable_message_is_rejected(running: Running) -> None:
    with grpc.insecure_channel(running.url) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        err = _rpc_error(call, b"\xff\xff\xff\xff\x0f garbage")
        assert err.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    with grpcclient.InferenceServerClient(running.url) as c:
        assert c.is_server_live() is True


def test_undecodable_message_gets_internal_from_the_own_server(running: Running) -> None:
    if running.fake.config.grpc_server_impl != "naiad":
        pytest.skip("grpcio words its own deserialization error")
    with grpc.insecure_channel(running.url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for garbage in (b"\xff\xff\xff\xff\x0f garbage", b"\x0a\x05ab"):
            err = _rpc_error(call, garbage)
            assert (err.code(), err.details()) == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
    with grpcclient.InferenceServerClient(running.url) as c:
        assert c.is_server_live() is True


def test_repeated_infer_requests_each_get_their_own_tensors(running: Running,
                                                            client: grpcclient.InferenceServerClient) -> None:
    """The same layout again and again (decoded from the message bytes once seen), then unlike ones."""
    rng = np.random.default_rng(3)
    for _ in range(4):
        a, b = rng.standard_normal((1, 4)).astype(np.float32), rng.integers(0, 9, (2,)).astype(np.int64)
        result = client.infer("echo", [_input("A", a, "FP32"), _input("B", b, "INT64")])
        np.testing.assert_array_equal(result.as_numpy("OUT_A"), a)
        np.testing.assert_array_equal(result.as_numpy("OUT_B"), b)
    result = client.infer("echo", [_input("A", a, "FP32"), _input("B", b, "INT64")], request_id="with-id")
    assert result.get_response().id == "with-id"
    np.testing.assert_array_equal(result.as_numpy("OUT_B"), b)
    short = np.zeros((1, 3), np.float32)
    result = client.infer("echo", [_input("A", short, "FP32"), _input("B", b, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("OUT_A"), short)
    err = _client_error(client.infer, "nope", [_input("A", a, "FP32"), _input("B", b, "INT64")])
    assert err.status() == "StatusCode.NOT_FOUND"


def test_unary_cancel_reaches_core(running: Running, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    request = _gate_request("unary-wait", "never-completes")
    future = stub.ModelInfer.future(request)
    # The request is in the core once the fake has seen it; wait on that, then cancel.
    running.fake.wait_seen("unary-wait")
    future.cancel()
    assert running.fake.cancelled.get(timeout=WAIT) == "unary-wait"


# ---------------------------------------------------------------- streaming


def _gate_request(key: str, after: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="gate", id=key)
    request.inputs.add(name="KEY", datatype="BYTES", shape=[1]).contents.bytes_contents.append(key.encode())
    request.inputs.add(name="AFTER", datatype="BYTES", shape=[1]).contents.bytes_contents.append(after.encode())
    return request


def _gate_inputs(key: str, after: str) -> list[grpcclient.InferInput]:
    return [
        _input("KEY", np.array([key], dtype=np.object_), "BYTES"),
        _input("AFTER", np.array([after], dtype=np.object_), "BYTES"),
    ]


def test_stream_responses_as_they_complete(running: Running) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(running.url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("gate", _gate_inputs("s-first", "s-second"), request_id="s-first")
        c.async_stream_infer("gate", _gate_inputs("s-second", ""), request_id="s-second")
        got = [results.get(timeout=WAIT) for _ in range(2)]
        c.stop_stream()
    assert [e for _, e in got] == [None, None]
    assert [r.get_response().id for r, _ in got] == ["s-second", "s-first"]
    for result, _ in got:
        assert result.get_response().parameters["triton_final_response"].bool_param is True
        assert result.as_numpy("KEY_OUT")[0] == result.get_response().id.encode()


def test_stream_errors_keep_stream_open(running: Running) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(running.url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        x = [_input("X", np.array([1, 2], dtype=np.int32), "INT32")]
        c.async_stream_infer("nope", x, request_id="e1")
        _, err = results.get(timeout=WAIT)
        assert isinstance(err, InferenceServerException)
        assert err.message() == "Request for unknown model: 'nope' is not found"
        c.async_stream_infer("echo", x, request_id="e2", parameters={"fail": "x"})
        _, err = results.get(timeout=WAIT)
        assert err.message() == "model failed: x"
        c.async_stream_infer("echo", x, request_id="ok", enable_empty_final_response=True)
        result, err = results.get(timeout=WAIT)
        assert err is None and result.as_numpy("OUT_X").tolist() == [1, 2]
        assert result.get_response().parameters["triton_final_response"].bool_param is True
        c.stop_stream()


def test_stream_error_message_echoes_request_identity(running: Running) -> None:
    channel = grpc.insecure_channel(running.url)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    bad = pb.ModelInferRequest(model_name="echo", model_version="1", id="bad-1", raw_input_contents=[b"\0"])
    bad.inputs.add(name="A", datatype="WHAT", shape=[1])
    good = pb.ModelInferRequest(model_name="echo", id="good-1", raw_input_contents=[b"\3"])
    good.inputs.add(name="A", datatype="INT8", shape=[1])
    bad_flag = pb.ModelInferRequest(model_name="echo", id="bad-2", raw_input_contents=[b"\3"])
    bad_flag.inputs.add(name="A", datatype="INT8", shape=[1])
    bad_flag.parameters["triton_enable_empty_final_response"].string_param = "yes"
    responses = list(stub.ModelStreamInfer(iter([bad, good, bad_flag])))
    channel.close()
    by_id = {r.infer_response.id: r for r in responses}
    assert set(by_id) == {"bad-1", "good-1", "bad-2"}
    first = by_id["bad-1"]
    assert first.error_message == "invalid datatype 'WHAT' for input 'A'"
    assert (first.infer_response.model_name, first.infer_response.model_version) == ("echo", "1")
    assert len(first.infer_response.outputs) == 0
    assert by_id["good-1"].error_message == ""
    assert by_id["good-1"].infer_response.raw_output_contents[0] == b"\3"
    assert by_id["bad-2"].error_message == (
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    )


def test_stream_grpc_error_mode_ends_with_status(running: Running) -> None:
    channel = grpc.insecure_channel(running.url)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    bad = pb.ModelInferRequest(model_name="nope", id="x")
    call = stub.ModelStreamInfer(iter([bad]), metadata=(("triton_grpc_error", "true"),))
    with pytest.raises(grpc.RpcError) as info:
        list(call)
    channel.close()
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Request for unknown model: 'nope' is not found"


def test_stream_half_close_finishes_in_flight(running: Running) -> None:
    channel = grpc.insecure_channel(running.url)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    # h-wait completes only after h-go, which is the last request; the client half-closes after sending both.
    requests = [_gate_request("h-wait", "h-go"), _gate_request("h-mid", ""), _gate_request("h-go", "")]
    call = stub.ModelStreamInfer(iter(requests))
    ids = [r.infer_response.id for r in call]
    channel.close()
    assert sorted(ids) == ["h-go", "h-mid", "h-wait"]
    assert ids.index("h-go") < ids.index("h-wait")
    assert call.code() == grpc.StatusCode.OK


def test_stream_requests_reach_core_in_order(running: Running) -> None:
    channel = grpc.insecure_channel(running.url)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    requests = []
    for i in range(50):
        r = pb.ModelInferRequest(model_name="echo", id=f"ord-{i}", raw_input_contents=[bytes([i])])
        r.inputs.add(name="A", datatype="UINT8", shape=[1])
        r.parameters["sequence_id"].int64_param = 900
        requests.append(r)
    responses = list(stub.ModelStreamInfer(iter(requests)))
    channel.close()
    assert len(responses) == 50
    order = [r.id for r in running.fake.seen if r.id.startswith("ord-")]
    assert order == [f"ord-{i}" for i in range(50)]


def test_stream_cancel_cancels_in_flight(running: Running) -> None:
    with grpcclient.InferenceServerClient(running.url) as c:
        c.start_stream(callback=lambda result, error: None)
        c.async_stream_infer("gate", _gate_inputs("c-wait", "c-never"), request_id="c-wait")
        running.fake.wait_seen("c-wait")
        c.stop_stream(cancel_requests=True)
    assert running.fake.cancelled.get(timeout=WAIT) == "c-wait"
    with grpcclient.InferenceServerClient(running.url) as c:
        assert c.is_server_ready() is True


def _dec_request(request_id: str, count: int, empty_final: bool | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="dec", id=request_id)
    request.inputs.add(name="COUNT", datatype="INT32", shape=[1]).contents.int_contents.append(count)
    if empty_final is not None:
        request.parameters["triton_enable_empty_final_response"].bool_param = empty_final
    return request


def test_stream_decoupled_many_responses(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    responses = list(stub.ModelStreamInfer(iter([_dec_request("d3", 3), _dec_request("d0", 0)])))
    assert [r.error_message for r in responses] == ["", "", ""]
    assert [r.infer_response.id for r in responses] == ["d3"] * 3
    values = [np.frombuffer(r.infer_response.raw_output_contents[0], "<i4")[0] for r in responses]
    assert values == [0, 1, 2]
    assert [r.infer_response.parameters["triton_final_response"].bool_param for r in responses] == [False] * 3


def test_stream_decoupled_empty_final_response(running: Running) -> None:
    collector: queue.Queue[tuple[Any, Any]] = queue.Queue()
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], dtype=np.int32))
    with grpcclient.InferenceServerClient(running.url) as c:
        c.start_stream(callback=lambda result, error: collector.put((result, error)))
        c.async_stream_infer("dec", [count], request_id="ef", enable_empty_final_response=True)
        got = [collector.get(timeout=WAIT) for _ in range(3)]
        c.stop_stream()
    assert [e for _, e in got] == [None] * 3
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got]
    assert finals == [False, False, True]
    last = got[-1][0].get_response()
    assert (last.id, last.model_name, len(last.outputs)) == ("ef", "dec", 0)
    assert [r.as_numpy("OUT").tolist() for r, _ in got[:2]] == [[0], [1]]


def test_stream_decoupled_error_ends_that_request_only(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    responses = list(stub.ModelStreamInfer(iter([_dec_request("neg", -1), _dec_request("one", 1, True)])))
    errors = [r for r in responses if r.error_message]
    assert [(r.error_message, r.infer_response.id) for r in errors] == [("negative count -1", "neg")]
    ok = [r.infer_response for r in responses if not r.error_message]
    assert [(r.id, r.parameters["triton_final_response"].bool_param) for r in ok] == [("one", False), ("one", True)]
