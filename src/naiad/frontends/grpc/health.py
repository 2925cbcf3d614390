"""The standard gRPC health service (grpc.health.v1.Health/Check): SERVING while the server is ready.

grpcio-health-checking pins a newer protobuf than tritonclient's generated code allows, and
the messages are one field each, so they are encoded here by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from naiad.core.facade import ServerAPI

SERVICE = "grpc.health.v1.Health"
_SERVING = b"\x08\x01"      # HealthCheckResponse{status: SERVING}
_NOT_SERVING = b"\x08\x02"  # HealthCheckResponse{status: NOT_SERVING}


def health_handler(server: ServerAPI) -> grpc.GenericRpcHandler:
    async def check(request: bytes, context: Any) -> bytes:
        return _SERVING if server.control.is_ready() else _NOT_SERVING

    method = grpc.unary_unary_rpc_method_handler(
        check, request_deserializer=lambda data: data, response_serializer=lambda data: data
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": method})
