"""A do-nothing v2 endpoint used to measure load.py's own ceiling.

    python benchmarks/trivial_server.py [--http-port 0] [--grpc-port 0] [--h2-grpc-port 0]

HTTP: a raw asyncio protocol (uvloop when installed) that reads each request and answers a
canned 200 response of an add_sub-sized JSON body, with no routing or decoding. gRPC: grpc.aio
with a generic handler for ModelInfer answering canned bytes, no protobuf decoding (what a
Python grpcio server can do at best). h2-gRPC: h2grpc.py's canned HTTP/2 responder, far cheaper
than grpcio, used to find the gRPC load generator's ceiling. Listens on 127.0.0.1 only; prints
`TRIVIAL_READY {"http_port": .., "grpc_port": .., "h2_grpc_port": ..}` once all listen, and
exits after --lifetime seconds (default 900) or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
GRPC_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _canned_http_response() -> bytes:
    data = [float(i) for i in range(16)]
    body = json.dumps({"model_name": "add_sub", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": data},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 16], "data": data}]},
        separators=(",", ":")).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _canned_grpc_response() -> bytes:
    from tritonclient.grpc import service_pb2

    resp = service_pb2.ModelInferResponse(model_name="add_sub", model_version="1")
    for name in ("OUTPUT0", "OUTPUT1"):
        out = resp.outputs.add()
        out.name, out.datatype = name, "FP32"
        out.shape.extend([1, 16])
        resp.raw_output_contents.append(bytes(64))
    return resp.SerializeToString()


class _HttpProtocol(asyncio.Protocol):
    response = _canned_http_response()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.buf = bytearray()
        self.need = -1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                idx = self.buf.find(b"\r\n\r\n")
                if idx < 0:
                    return
                head = bytes(self.buf[:idx]).lower()
                del self.buf[:idx + 4]
                pos = head.find(b"\r\ncontent-length:")
                end = head.find(b"\r\n", pos + 2) if pos >= 0 else -1
                self.need = int(head[pos + 17:end if end > 0 else len(head)]) if pos >= 0 else 0
            if len(self.buf) < self.need:
                return
            del self.buf[:self.need]
            self.need = -1
            self.transport.write(self.response)


async def _serve(http_port: int, grpc_port: int, h2_grpc_port: int, lifetime: float) -> None:
    import grpc
    from h2grpc import TrivialH2GrpcServer

    loop = asyncio.get_running_loop()
    http = await loop.create_server(_HttpProtocol, "127.0.0.1", http_port)
    canned = _canned_grpc_response()
    h2 = await loop.create_server(lambda: TrivialH2GrpcServer(canned), "127.0.0.1", h2_grpc_port)

    async def infer(request: bytes, context) -> bytes:
        return canned

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            if details.method == GRPC_INFER_METHOD:
                return grpc.unary_unary_rpc_method_handler(infer)
            return None

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Handler(),))
    bound_grpc = server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("TRIVIAL_READY " + json.dumps({"http_port": http.sockets[0].getsockname()[1],
                                         "grpc_port": bound_grpc,
                                         "h2_grpc_port": h2.sockets[0].getsockname()[1]}), flush=True)
    try:
        await asyncio.wait_for(stop.wait(), lifetime)
    except TimeoutError:
        pass
    http.close()
    h2.close()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--h2-grpc-port", type=int, default=0)
    parser.add_argument("--lifetime", type=float, default=900.0, help="exit after this many seconds")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(args.http_port, args.grpc_port, args.h2_grpc_port, args.lifetime))


if __name__ == "__main__":
    main()
