"""inference.GRPCInferenceService handlers: decode the protobuf, call the Server facade, encode."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from naiad.frontends.grpc.infer_codec import (
    SHM_DISABLED_MESSAGE,
    encode_infer_response,
)
from naiad.frontends.grpc.infer_memo import InferDecoder, InferEncoder
from naiad.frontends.grpc.status import error_of, guarded, status_of
from naiad.frontends.grpc.stream import Fatal, StreamSession, grpc_error_mode
from naiad.frontends.security import check_model_name
from naiad.observability.trace_context import incoming_traceparent, propagating
from naiad.protocol.errors import DecoupledModelError, ErrorCode, NaiadError, internal, invalid_arg, unsupported
from naiad.protocol.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

DECOUPLED_UNARY_MESSAGE = "ModelInfer RPC doesn't support models with decoupled transaction policy"
REPOSITORY_NAME_MESSAGE = "'repository_name' specification is not supported"
DESERIALIZE_MESSAGE = "Exception deserializing request!"


def _check_repository_name(name: str) -> None:
    if name:
        raise unsupported(REPOSITORY_NAME_MESSAGE)


def _tensor_metadata(entries: list[dict]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in entries
    ]


def _load_parameters(params: Any) -> tuple[str | None, dict[str, bytes]]:
    """RepositoryModelLoad parameters: `config` (string_param) and `file:<path>` (bytes_param) entries."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if key == "config":
            if choice != "string_param":
                raise invalid_arg("invalid value type for load parameter 'config', expected string_param.")
            config = param.string_param
        elif key.startswith("file:"):
            if choice != "bytes_param":
                raise invalid_arg(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[key] = param.bytes_param
    return config, files


def parse_infer_request(message: bytes) -> pb.ModelInferRequest:
    """A serialized ModelInferRequest, parsed; one that does not parse is INTERNAL, as gRPC servers answer it."""
    try:
        return pb.ModelInferRequest.FromString(message)
    except Exception:
        raise internal(DESERIALIZE_MESSAGE) from None  # what the server says of any message it cannot parse


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 gRPC service on top of the Server facade."""

    def __init__(self, server: ServerAPI, serialized_responses: bool = False) -> None:
        """`serialized_responses`: ModelInfer returns its response serialized (for a server that sends
        bytes as they are; grpcio serializes the message itself)."""
        self._server = server
        self._inference = server.inference
        self._allow_shm = server.config.allow_client_shm
        self._decoder = InferDecoder(self._allow_shm)
        self._encode: Callable[[InferenceResponse], pb.ModelInferResponse | bytes] = (
            InferEncoder().encode if serialized_responses else encode_infer_response)

    async def _stream_responses(
        self, request: InferenceRequest
    ) -> AsyncIterator[tuple[InferenceResponse | None, bool]]:
        """Responses of one stream request (one for ordinary models, any number for decoupled ones)."""
        async for item in self._inference.stream(request, errors_inline=True):
            yield item

    def _check_client_shm(self) -> None:
        if not self._allow_shm:
            raise unsupported(SHM_DISABLED_MESSAGE)

    # ------------------------------------------------------------ health and metadata

    @guarded
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._server.control.is_live())

    @guarded
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._server.control.is_ready())

    @guarded
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # Triton 2.51 answers OK with ready=false for unknown or unavailable models (observed),
        # but INVALID_ARGUMENT for a version string that is not a version.
        try:
            return pb.ModelReadyResponse(ready=self._server.control.model_ready(request.name, request.version))
        except NaiadError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                return pb.ModelReadyResponse(ready=False)
            raise

    @guarded
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        meta = self._server.info.metadata()
        return pb.ServerMetadataResponse(
            name=meta["name"], version=meta["version"], extensions=meta.get("extensions", [])
        )

    @guarded
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = self._server.info.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta.get("versions", []),
            platform=meta.get("platform", ""),
            inputs=_tensor_metadata(meta.get("inputs", [])),
            outputs=_tensor_metadata(meta.get("outputs", [])),
        )

    @guarded
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self._server.info.model_config(request.name, request.version))
        return response

    @guarded
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        stats = self._server.info.model_statistics(request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # ------------------------------------------------------------ inference

    def serialized_infer_handler(self) -> grpc.RpcMethodHandler:
        """ModelInfer for a server that can hand over the request message as received (Naiad's own):
        a request laid out like one seen before is decoded from its bytes without being parsed."""
        return grpc.unary_unary_rpc_method_handler(
            self.ModelInfer, response_serializer=pb.ModelInferResponse.SerializeToString)  # unless already bytes

    def _decode(self, request: pb.ModelInferRequest | bytes | bytearray | memoryview) -> InferenceRequest:
        """An invalid model name first; then an unknown model (NOT_FOUND) rather than what its tensors
        got wrong. The model is looked up only when decoding fails: a good request is looked up once, in infer.
        A serialized request (serialized_infer_handler) is parsed only when it is not one seen before."""
        serialized = None
        if isinstance(request, (bytes, bytearray, memoryview)):
            serialized = request if type(request) is bytes else bytes(request)  # an inflated message
            decoded = self._decoder.decode_serialized(serialized)
            if decoded is not None:
                return decoded  # its model name was checked when its layout was first decoded
            request = parse_infer_request(serialized)
        check_model_name(request.model_name)
        try:
            return self._decoder.decode(request, serialized)
        except NaiadError:
            self._inference.check_servable(request.model_name, request.model_version)
            raise

    async def ModelInfer(self, request: pb.ModelInferRequest | bytes, context: Any) -> pb.ModelInferResponse | bytes:
        # guarded's error handling, inline: the hottest call is spared a coroutine layer
        try:
            # a request laid out as one seen before is decoded here, without the call to _decode
            decoded = self._decoder.decode_serialized(request) if type(request) is bytes else None
            if decoded is None:
                decoded = self._decode(request)
            if propagating():
                with incoming_traceparent(context.invocation_metadata() or ()):
                    response = await self._inference.infer(decoded)
            else:
                response = await self._inference.infer(decoded)
            return self._encode(response)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except DecoupledModelError:
            err = unsupported(DECOUPLED_UNARY_MESSAGE)
        except Exception as exc:
            err = error_of(exc)
        await context.abort(status_of(err), err.message)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        session = StreamSession(self._stream_responses, self._decode, grpc_error_mode(context))
        async with contextlib.aclosing(session.responses(request_iterator)) as items:
            async for item in items:
                if isinstance(item, Fatal):
                    await context.abort(status_of(item.error), item.error.message)
                yield item

    # ------------------------------------------------------------ model repository

    @guarded
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        _check_repository_name(request.repository_name)
        entries = self._server.control.repository_index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=e["name"],
                    version=e.get("version", ""),
                    state=e.get("state", ""),
                    reason=e.get("reason", ""),
                )
                for e in entries
            ]
        )

    @guarded
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        _check_repository_name(request.repository_name)
        config, files = _load_parameters(request.parameters)
        await self._server.control.load_model(request.model_name, config_json=config, files=files or None)
        return pb.RepositoryModelLoadResponse()

    @guarded
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        _check_repository_name(request.repository_name)
        unload_dependents = False
        if "unload_dependents" in request.parameters:
            param = request.parameters["unload_dependents"]
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise invalid_arg("invalid value type for 'unload_dependents' parameter, expected bool_param.")
            unload_dependents = param.bool_param
        await self._server.control.unload_model(request.model_name, unload_dependents=unload_dependents)
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------ shared memory

    @guarded
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._server.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region["name"],
                    key=region["key"],
                    offset=region.get("offset", 0),
                    byte_size=region["byte_size"],
                )
            )
        return response

    @guarded
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._check_client_shm()
        self._server.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @guarded
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._check_client_shm()
        self._server.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @guarded
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self._server.shared_memory.cuda_status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=region["name"], device_id=region.get("device_id", 0), byte_size=region["byte_size"]
                )
            )
        return response

    @guarded
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self._check_client_shm()
        self._server.shared_memory.cuda_register(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @guarded
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._check_client_shm()
        self._server.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------ trace and log settings

    @guarded
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        """An empty value list clears a model override (sent as null); one value is a string, several a list."""
        changes: dict[str, Any] = {}
        for key, setting in request.settings.items():
            values = list(setting.value)
            if not values:
                changes[key] = None
            else:
                changes[key] = values if key == "trace_level" else values[0]
        if changes:
            current = self._server.info.update_trace_settings(request.model_name, changes)
        else:
            current = self._server.info.get_trace_settings(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in current.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @guarded
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        changes: dict[str, Any] = {}
        for key, setting in request.settings.items():
            choice = setting.WhichOneof("parameter_choice")
            changes[key] = getattr(setting, choice) if choice else None
        current = self._server.info.update_log_settings(changes) if changes else self._server.info.get_log_settings()
        response = pb.LogSettingsResponse()
        for key, value in current.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response
