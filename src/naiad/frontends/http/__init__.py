"""HTTP/REST frontend: KServe v2 protocol plus Triton's extensions, served by uvicorn in the server's loop."""

from naiad.frontends.http.server import HttpFrontend

__all__ = ["HttpFrontend"]
