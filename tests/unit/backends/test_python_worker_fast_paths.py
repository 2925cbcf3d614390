"""The Python-model worker's per-request shortcuts (received inputs, input lookup, freeing a batch's message) behave exactly like the general paths."""

from __future__ import annotations

import pickle
import uuid
import weakref

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from naiad.runtime.process.python_host import PythonModelHost
from naiad.runtime.process.shm import remove_prefixed
from naiad.runtime.process.tensors import pack, unpack_one

INLINE_GROUPS = [
    [("A", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16)), ("B", "INT64", np.array([[-3, 7]]))],
    [],
    [("C", "BOOL", np.array([True, False, True])), ("D", "FP16", np.ones((2, 2), np.float16)),
     ("E", "BF16", np.array([0x3F80, 0x4000], np.uint16)), ("F", "UINT8", np.arange(200, dtype=np.uint8))],
]


@pytest.fixture
def host(tmp_path):
    model = tmp_path / "1" / "model.py"
    model.parent.mkdir()
    model.write_text("class TritonPythonModel:\n    def execute(self, requests):\n        return []\n")
    prefix = f"npw{uuid.uuid4().hex[:8]}_"
    init = {"prefix": prefix, "decoupled": False, "model_name": "m", "model_version": 3, "model_file": str(model),
            "args": {"model_instance_name": "m_0"}}
    yield PythonModelHost(channel=None, init=init)  # type: ignore[arg-type]
    remove_prefixed(prefix)


def test_received_inputs_match_the_general_unpacking(host):
    groups = [INLINE_GROUPS[0], [("S", "BYTES", np.array([b"x", b"yz"], dtype=np.object_)),
                                 ("Z", "INT32", np.zeros((0, 2), np.int32))]]
    block, metas = pack(None, groups)
    assert block is None
    described = [(f"id{i}", i, 0, "{}", 0, ("OUT",), metas[i]) for i in range(len(groups))]
    requests = host._requests(pickle.loads(pickle.dumps(("x", 5, None, described, []))))
    assert [r.request_id() for r in requests] == ["id0", "id1"]
    assert [r.model_version() for r in requests] == [3, 3]
    for request, group in zip(requests, metas):
        for tensor, meta in zip(request.inputs(), group):
            expected = unpack_one(None, meta, copy=False)
            array = tensor.as_numpy()
            assert tensor.name() == meta[0] and tensor.datatype() == meta[1]
            assert array.dtype == expected.dtype and array.shape == expected.shape
            np.testing.assert_array_equal(array, expected)
            if meta[1] != "BYTES":
                assert array.flags.writeable and array.flags.c_contiguous
    assert pb_utils.get_input_tensor_by_name(requests[0], "B").as_numpy().tolist() == [[-3, 7]]
    assert requests[0].release_flags() == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    assert requests[0].requested_output_names() == ["OUT"]


def test_a_batch_message_is_freed_before_the_worker_waits_for_the_next(host):
    """The previous batch's message (and the input buffers it carries) is released once the batch ran,
    not when the next message arrives (which would put that work on the next request's path)."""

    class Payload:  # stands in for a batch's input buffers
        pass

    payload = Payload()
    gone = weakref.ref(payload)
    messages = [("x", 1, payload)]
    del payload
    seen: list[bool] = []

    class Inbox:
        def next_command(self) -> tuple:
            if messages:
                return messages.pop()
            seen.append(gone() is None)  # waiting for the next message: the last one is gone already
            return ("f",)

    ran: list[int] = []
    host.runtime.inbox = Inbox()
    host._run_batch = lambda message: ran.append(message[1])
    host._finalize = lambda: None
    host._command_loop()
    assert ran == [1] and seen == [True]


def test_input_lookup_by_name_is_the_same_for_received_and_built_requests(host):
    block, metas = pack(None, [INLINE_GROUPS[0]])
    received = host._requests(("x", 1, block, [("", 0, 0, "{}", 0, (), metas[0])], []))[0]
    for name in ("A", "B"):
        expected = next(t for t in received.inputs() if t.name() == name)
        assert pb_utils.get_input_tensor_by_name(received, name) is expected
    assert pb_utils.get_input_tensor_by_name(received, "missing") is None

    class Renamed(pb_utils.Tensor):  # a model's own Tensor subclass: its name() is what counts
        __slots__ = ()

        def name(self) -> str:
            return "renamed"

    tensor = Renamed("A", np.zeros(2, np.float32))
    built = pb_utils.InferenceRequest(model_name="m", inputs=[tensor], requested_output_names=[])
    assert pb_utils.get_input_tensor_by_name(built, "renamed") is tensor
    assert pb_utils.get_input_tensor_by_name(built, "A") is None
