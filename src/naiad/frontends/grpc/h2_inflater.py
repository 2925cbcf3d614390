"""Inflating compressed gRPC request messages without taking the event loop's CPU.

`Inflation` inflates one message incrementally and stops as soon as its output passes the limit.
Large messages are inflated by `Inflater`: on Linux in worker processes running at the lowest CPU
priority (nice 19), writing into shared memory (a memfd the server maps), so a stream of
decompression bombs only uses the CPU time the event loop and the models leave over. A thread
would not do: it shares the interpreter lock with the loop, and a low-priority thread holding it
would stall the loop behind every other process on the machine. Elsewhere, threads inflate.

This module imports only the standard library: it is also the worker's program
(`python -m naiad.frontends.grpc.h2_inflater FD`), which should stay small.
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

INFLATE_CHUNK = 256 << 10  # output per zlib call: the worker checks the limit (and a thread the GIL) this often

_JOB = struct.Struct(">BQQ")    # gzip (1) or deflate (0), limit, length of the compressed message
_DONE = struct.Struct(">BQI")   # outcome, inflated size, length of the error text that follows
_OK, _TOO_LARGE, _BAD = range(3)
WORKER_IDLE_EXIT = 6.0  # a worker with no job for this long exits (its memory goes back to the system)
_REUSE_WITHIN = WORKER_IDLE_EXIT / 2  # the server replaces a worker idle longer than this rather than race its exit


class MessageTooLarge(ValueError):
    """A message (or what it inflates to) is larger than the server accepts: RESOURCE_EXHAUSTED."""


class Inflation:
    """Incremental decompression of one message that stops as soon as the output passes `limit`.

    Small output grows in a bytearray; `spill()` moves it to a memory mapping (anonymous, or the one
    given) before a large inflation, so that its memory goes back to the system when it is freed (a
    bomb leaves nothing behind in the allocator's arenas)."""

    __slots__ = ("_z", "_tail", "_out", "_size", "_limit", "_done")

    def __init__(self, encoding: str, data: bytes, limit: int) -> None:
        self._z = zlib.decompressobj(31 if encoding == "gzip" else 15)
        self._tail = data
        self._out: bytearray | mmap.mmap | None = bytearray()
        self._size = 0
        self._limit = limit
        self._done = False

    @property
    def size(self) -> int:
        return self._size

    def spill(self, into: mmap.mmap | None = None) -> None:
        """Go on in `into` (at least limit + 1 bytes; the caller closes it) or in a mapping of its own."""
        small = self._out
        assert isinstance(small, bytearray), "spilled twice"
        mapping = into if into is not None else mmap.mmap(-1, self._limit + 1)
        mapping[:self._size] = small
        self._out = mapping

    def run(self, budget: int) -> bool:
        """Inflate up to `budget` more bytes; True once the whole message is inflated."""
        z, out, produced = self._z, self._out, 0
        assert out is not None, "inflation already closed"
        while not self._done and produced < budget:
            step = min(INFLATE_CHUNK, budget - produced, self._limit - self._size + 1)
            chunk = z.decompress(self._tail, step)
            self._tail = z.unconsumed_tail
            produced += len(chunk)
            end = self._size + len(chunk)
            if end > self._limit:
                del out, chunk
                self.close()
                raise MessageTooLarge(f"Received message larger than max (inflated past {self._limit} bytes)")
            out[self._size:end] = chunk
            self._size = end
            self._done = z.eof or (len(chunk) < step and not self._tail)
        return self._done

    def result(self) -> bytearray | memoryview:
        if not self._z.eof:
            self.close()
            raise ValueError("Compressed message is truncated")
        out = self._out
        return memoryview(out)[:self._size] if isinstance(out, mmap.mmap) else out  # type: ignore[return-value]

    def close(self) -> None:
        """Free the output now (it is otherwise reachable from tracebacks until the garbage collector runs)."""
        out, self._out, self._tail = self._out, None, b""
        if isinstance(out, mmap.mmap):
            out.close()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("the other side closed")
        got += n
    return bytes(out)


# ------------------------------------------------------------------ the worker process


def _serve(sock: socket.socket) -> None:
    """Inflate jobs until the server closes the socket or none came for WORKER_IDLE_EXIT seconds."""
    sock.settimeout(WORKER_IDLE_EXIT)
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, _JOB.size, 1)
        except TimeoutError:
            return
        if not head or not fds:
            return
        sock.settimeout(None)
        head += _recv_exactly(sock, _JOB.size - len(head))
        gzip, limit, length = _JOB.unpack(head)
        try:
            data = _recv_exactly(sock, length)
            out = mmap.mmap(fds[0], limit + 1)
        finally:
            os.close(fds[0])
        job = Inflation("gzip" if gzip else "deflate", data, limit)
        del data
        try:
            job.spill(out)
            job.run(limit + 1)
            job.result()
            reply, text = _DONE.pack(_OK, job.size, 0), b""
        except MessageTooLarge as exc:
            reply, text = _DONE.pack(_TOO_LARGE, 0, 0), str(exc).encode()
        except (ValueError, zlib.error) as exc:
            reply, text = _DONE.pack(_BAD, 0, 0), str(exc).encode()
        finally:
            job.close()  # unmaps `out`: the pages stay in the memfd for the server
        sock.sendall(reply[:-4] + len(text).to_bytes(4, "big") + text)
        sock.settimeout(WORKER_IDLE_EXIT)


def main() -> None:
    os.nice(19)
    with socket.socket(fileno=int(sys.argv[1])) as sock:
        try:
            _serve(sock)
        except (OSError, EOFError):
            pass  # the server went away


# ------------------------------------------------------------------ the server's side


def _worker_env() -> dict[str, str]:
    """The server's environment, with the directory naiad is imported from first on the path."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}


class _Worker:
    """One worker process and the socket to it; used by one thread at a time."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "naiad.frontends.grpc.h2_inflater", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=_worker_env())
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock = mine
        self.used = time.monotonic()

    def inflate(self, encoding: str, data: bytes, limit: int) -> memoryview:
        fd = os.memfd_create("naiad-grpc-inflate", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, limit + 1)
            out = mmap.mmap(fd, limit + 1)
            socket.send_fds(self.sock, [_JOB.pack(encoding == "gzip", limit, len(data))], [fd])
        finally:
            os.close(fd)
        try:
            self.sock.sendall(data)
            outcome, size, length = _DONE.unpack(_recv_exactly(self.sock, _DONE.size))
            text = _recv_exactly(self.sock, length).decode(errors="replace")
        except BaseException:
            out.close()
            raise
        self.used = time.monotonic()
        if outcome != _OK:
            out.close()
            raise MessageTooLarge(text) if outcome == _TOO_LARGE else ValueError(text)
        return memoryview(out)[:size]

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread waiting for this worker's answer
        except OSError:
            pass
        self.sock.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Inflater:
    """Where large messages are inflated: `threads` at a time, each thread with its own worker process
    (Linux) or inflating itself (elsewhere)."""

    def __init__(self, threads: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="grpc-inflate")
        self._local = threading.local()
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.uses_processes = hasattr(os, "memfd_create") and hasattr(socket, "send_fds")

    def submit(self, encoding: str, data: bytes, limit: int) -> concurrent.futures.Future[bytearray | memoryview]:
        """The message inflated (raises MessageTooLarge, ValueError or zlib.error)."""
        return self._pool.submit(self._inflate if self.uses_processes else _inflate_here, encoding, data, limit)

    def _inflate(self, encoding: str, data: bytes, limit: int) -> memoryview:
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is not None and (time.monotonic() - worker.used > _REUSE_WITHIN or worker.process.poll() is not None):
            self._drop(worker)
            worker = None
        try:
            if worker is None:
                with self._lock:
                    if self._closed:
                        raise ValueError("the server is stopping")
                    worker = self._local.worker = _Worker()
                    self._workers.add(worker)
            return worker.inflate(encoding, data, limit)
        except (OSError, EOFError) as exc:  # the worker could not start or died (the server is stopping?)
            if worker is not None:
                self._drop(worker)
            raise ValueError(f"decompression failed: {exc}") from None

    def _drop(self, worker: _Worker) -> None:
        self._local.worker = None
        with self._lock:
            self._workers.discard(worker)
        worker.close()

    def close(self) -> None:
        """Stop the workers (a job still running fails) and the threads."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, set()
        for worker in workers:
            worker.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _inflate_here(encoding: str, data: bytes, limit: int) -> bytearray | memoryview:
    job = Inflation(encoding, data, limit)
    job.spill()
    job.run(limit + 1)
    return job.result()


if __name__ == "__main__":
    main()
