"""ProcessInstance: the adapter running an instance in a worker process, keeping one healthy worker behind it.

The worker hosts either a Triton Python model (model.py, see python_host.py) or any tensor backend's
instance (backend_host.py); this side is the same for both: launch, batches through shared memory,
restart after a crash, health and finalize.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import Any, Final

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import (
    BackendRequest,
    BackendResponse,
    ChatTemplate,
    ExecutionOutcome,
    InstanceSpec,
    ModelSource,
    ResponseCallback,
)
from naiad.config.model_config import config_to_json, datatype_name
from naiad.protocol.errors import NaiadError, internal, invalid_arg
from naiad.runtime.memory import rss_bytes
from naiad.runtime.process.launcher import Launch, launch_for
from naiad.runtime.process.session import WorkerSession, WorkerStartError
from naiad.runtime.process.shm import DEFAULT_BYTE_SIZE, GROWTH_BYTE_SIZE

log = logging.getLogger("naiad.python")

KIND_NAMES = {mc.ModelInstanceGroup.KIND_CPU: "CPU", mc.ModelInstanceGroup.KIND_GPU: "GPU",
              mc.ModelInstanceGroup.KIND_MODEL: "MODEL", mc.ModelInstanceGroup.KIND_AUTO: "CPU"}
READY_CHECK_INTERVAL = 1.0
MAX_RESTART_DELAY = 30.0
# Batches one worker holds at once under the default scheduler (see execute_requests): two, and up
# to PIPELINE_MAX_DEPTH for a model whose executions are short, so that the work handed over ahead
# stays within about PIPELINE_BUDGET_NS (and a request waits little behind it).
PIPELINE_DEPTH = 2
PIPELINE_MAX_DEPTH = 32
PIPELINE_BUDGET_NS = 1_000_000


def _settle_with_none(future: asyncio.Future[Any], _: object) -> None:
    if not future.done():
        future.set_result(None)


def pipeline_depth(average_execution_ns: float) -> int:
    """Batches to hand a lone worker ahead: as many as fit in PIPELINE_BUDGET_NS, from 2 to 32."""
    affordable = int(PIPELINE_BUDGET_NS // max(average_execution_ns, 1.0))
    return max(PIPELINE_DEPTH, min(PIPELINE_MAX_DEPTH, affordable))


def _byte_size(settings: dict[str, str], key: str, default: int) -> int:
    """A positive byte count from --backend-config python,<key>=<n>."""
    raw = settings.get(key)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise invalid_arg(f"--backend-config python,{key} must be a positive number of bytes, got '{raw}'")
    return value


# What a worker hosts: a Triton Python model (model.py) or a tensor backend's instance.
PYTHON_HOST = "python"
BACKEND_HOST = "backend"


def initialize_args(source: ModelSource, spec: InstanceSpec) -> dict[str, str]:
    """Exactly the seven keys Triton passes to initialize(args)."""
    return {
        "model_config": config_to_json(source.config),
        "model_instance_kind": KIND_NAMES.get(spec.kind, "CPU"),
        "model_instance_name": spec.name,
        "model_instance_device_id": str(spec.device_id),
        "model_repository": str(source.model_dir),
        "model_version": str(source.version),
        "model_name": source.config.name,
    }


def host_init(source: ModelSource, spec: InstanceSpec, host: str) -> dict[str, Any]:
    """What the worker needs to build its instance: the model file and Triton's initialize args for a
    Python model; the backend, config and instance spec for a tensor backend (it loads the model itself)."""
    init: dict[str, Any] = {"host": host, "model_file": str(source.model_file), "args": initialize_args(source, spec)}
    if host == BACKEND_HOST:
        init["backend"] = source.config.backend
        init["config"] = source.config.SerializeToString()
        init["source"] = (source.version, str(source.model_dir), str(source.version_dir), dict(source.backend_settings))
        init["spec"] = (spec.name, spec.group.SerializeToString(), spec.kind, spec.device_id)
    return init


class ProcessInstance:
    """Requests go to the current worker; a worker that dies fails its requests and is replaced automatically."""

    executes: Final = "requests"
    tracks_unfinished = True
    in_worker_process = True

    def __init__(self, source: ModelSource, spec: InstanceSpec, launch: Launch, log_verbose: int = 0,
                 host: str = PYTHON_HOST) -> None:
        self.name = spec.name
        self._source = source
        self._launch = launch
        settings = source.backend_settings
        self._stub_timeout = float(settings.get("stub-timeout-seconds", "30") or 30)
        self._shm_prefix = "".join(c for c in settings.get("shm-region-prefix-name", "naiad_py_") if c not in "/\\")
        self._shm_sizes = (_byte_size(settings, "shm-default-byte-size", DEFAULT_BYTE_SIZE),
                           _byte_size(settings, "shm-growth-byte-size", GROWTH_BYTE_SIZE))
        self._init = {
            **host_init(source, spec, host),
            "decoupled": source.config.model_transaction_policy.decoupled,
            "model_name": source.config.name,
            "model_version": source.version,
            "log_verbose": log_verbose,
            "shm_sizes": self._shm_sizes,
        }
        self._input_types = {t.name: datatype_name(t.data_type) for t in source.config.input}
        self._serving: WorkerSession | None = None
        self._starting: WorkerSession | None = None
        self._restarter: asyncio.Task[Any] | None = None
        self._closing = False
        self._ready_value = True
        self._ready_checked = 0.0
        self._ready_task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Only a lone instance under the default scheduler: with several, a queued request could wait
        # behind a long execute while another worker sits idle.
        self._pipelined = (source.config.WhichOneof("scheduling_choice") is None
                           and sum(max(g.count, 1) for g in source.config.instance_group) <= 1)
        self._pipeline: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._awaiting_room = 0  # batches waiting for room in the pipeline (each holds the instance)
        self._execution_ns = 0.0  # moving average of the worker's execution time
        self._timed = False  # an execution time came back (until then the depth is PIPELINE_DEPTH)
        self._unstarted: list[tuple[Any, ...]] = []  # queued at a worker that died before running them
        self._unfinished: asyncio.Future[Any] | None = None  # a batch whose caller was cancelled mid-execute
        self._deaths = 0  # serving workers that died: what the model held in them is gone

    # ------------------------------------------------------------ worker management

    def _new_session(self) -> WorkerSession:
        session = WorkerSession(self.name, self._launch, self._init, self._input_types, self._source.server,
                                self._shm_prefix, self._on_death, self._shm_sizes)
        if self._pipelined:
            session.keep_unstarted = self._unstarted.extend
        return session

    async def _start_session(self) -> WorkerSession:
        session = self._new_session()
        self._starting = session
        try:
            await session.start()
        except BaseException:
            session.closing = True
            session.kill()
            await session.wait_exit()
            raise
        finally:
            self._starting = None
        return session

    async def start(self) -> None:
        """Start the first worker; its initialize error (or death) fails the load with the model's message."""
        self._loop = asyncio.get_running_loop()
        try:
            self._serving = await self._start_session()
        except WorkerStartError as exc:
            raise internal(f"Internal: {exc}") from None
        except OSError as exc:
            raise internal(f"unable to start a Python worker with '{self._launch.python}': {exc}") from None

    def _on_death(self, session: WorkerSession) -> None:
        if session is not self._serving or self._closing:
            return
        log.error("the worker process of model instance '%s' (pid %d) died; starting a new one", self.name, session.pid)
        self._serving = None
        self._deaths += 1
        self._restarter = asyncio.get_running_loop().create_task(self._restart(session))

    async def _restart(self, dead: WorkerSession) -> None:
        await dead.wait_exit()
        delay = 0.5
        while not self._closing:
            try:
                session = await self._start_session()
            except (WorkerStartError, OSError) as exc:
                log.error("restarting model instance '%s' failed: %s (retrying in %.1fs)", self.name, exc, delay)
            else:
                if self._closing:
                    await session.finalize(self._stub_timeout)
                    return
                self._serving = session
                log.info("model instance '%s' is ready again (worker pid %d)", self.name, session.pid)
                self._resubmit(session)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RESTART_DELAY)

    def _resubmit(self, session: WorkerSession | None) -> None:
        """Run the batches a dead worker never started on its replacement (Triton would still have had
        them in its queue); without one, they fail like the batch that was running."""
        batches, self._unstarted = self._unstarted, []
        for requests, respond, future in batches:
            try:
                if session is None:
                    raise internal(f"Stub process '{self.name}' is not healthy.")
                done = session.submit(requests, respond)
            except Exception as exc:  # no worker, or sending failed: answer like execute_requests does
                error = exc if isinstance(exc, NaiadError) else internal(f"unable to send requests to '{self.name}': {exc}")
                for index in range(len(requests)):
                    respond(index, BackendResponse(None, error=error, final=True))
                if not future.done():
                    future.set_result(None)
                continue
            done.add_done_callback(functools.partial(_settle_with_none, future))

    @property
    def pid(self) -> int:
        """Process id of the current worker (0 while none is serving)."""
        return self._serving.pid if self._serving is not None else 0

    # ------------------------------------------------------------ RequestModelInstance

    async def execute_requests(self, requests: list[BackendRequest], respond: ResponseCallback) -> ExecutionOutcome:
        pipeline = self._pipeline
        if self._pipelined:
            # Default scheduler: the next requests are already queued in the worker's pipe while this
            # one runs, so the worker goes from one execute to the next without sleeping in between, and
            # both processes wake up once for several requests. The worker still runs one execute at a
            # time, and holds at most `_depth` batches: this one waits for room first (holding the
            # instance, so later requests queue behind it), and is then sent at once.
            # Finished batches are dropped (and their times averaged) only once the pipeline is PIPELINE_DEPTH
            # long, `_depth`'s floor: at c=1 every other request, for two batches (~0.5k instructions less
            # per request than a look and a call each time).
            if len(pipeline) >= PIPELINE_DEPTH:
                self._settle(pipeline)
                if len(pipeline) >= PIPELINE_DEPTH and len(pipeline) >= self._depth:
                    await self._wait_for_room(pipeline)
        session = self._serving
        if session is None or not session.alive:
            error = internal(f"Stub process '{self.name}' is not healthy.")
            for index in range(len(requests)):
                respond(index, BackendResponse(None, error=error, final=True))
            return None
        try:
            done = session.submit(requests, respond)
        except Exception as exc:  # packing or sending failed: nothing reached the worker
            error = exc if isinstance(exc, NaiadError) else internal(f"unable to send requests to '{self.name}': {exc}")
            for index in range(len(requests)):
                respond(index, BackendResponse(None, error=error, final=True))
            return None
        if session.async_execute:
            return done  # async execute: the instance takes the next batch while this one runs
        if not self._pipelined:
            try:
                # Not shielded (a shield costs a loop iteration per batch): a cancelled caller cancels
                # `done` too, and the session then gives a fresh future for the batch's end.
                timing: ExecutionOutcome = await done
                return timing
            except asyncio.CancelledError:
                # The worker still runs the batch: the instance is busy until it ends.
                self._unfinished = session.finished(done) if done.cancelled() else done
                raise
        pipeline.append(done)
        return done

    async def _wait_for_room(self, pipeline: collections.deque[asyncio.Future[Any]]) -> None:
        """Wait until the worker holds fewer than `_depth` batches (the waiting batch counts as queued)."""
        self._awaiting_room += 1
        try:
            while len(pipeline) >= self._depth:
                # A cancelled caller here cancels pipeline[0], an earlier batch's future: harmless, the
                # worker answers it all the same (responses go through `respond`) and the window opens
                # one batch early; this batch is then never sent. Shielding every wait would cost a
                # loop hop per request.
                await pipeline[0]
                self._settle(pipeline)
        finally:
            self._awaiting_room -= 1

    def _settle(self, pipeline: collections.deque[asyncio.Future[Any]]) -> None:
        """Drop finished batches from the pipeline; their execution times set its depth."""
        while pipeline and pipeline[0].done():
            finished = pipeline.popleft()
            timing = None if finished.cancelled() else finished.result()
            if timing is not None:
                self._execution_ns += (timing[1] - timing[0] - self._execution_ns) * 0.125
                self._timed = True

    @property
    def _depth(self) -> int:
        """Batches the worker may hold now, from the moving average of its execution times."""
        return pipeline_depth(self._execution_ns) if self._timed else PIPELINE_DEPTH

    def chat_template(self) -> ChatTemplate | None:
        return None  # model.py has no tokenizer the server could ask

    def memory_bytes(self) -> int:
        """The worker's resident memory: the model lives there, not in the server."""
        pid = self.pid
        return rss_bytes(pid) if pid else 0

    def restarts(self) -> int:
        """How many serving workers died: each took the model's in-memory state (e.g. per-sequence sums) with it."""
        return self._deaths

    def queued(self) -> int:
        """Batches handed to the worker that it has not started yet (all but the oldest unfinished one),
        and those waiting for room to be handed over."""
        return max(self._unfinished_batches() - 1, 0) + self._awaiting_room

    def takes_at_once(self) -> int:
        """Under the default scheduler, the room left in the pipeline (at least 1); else 1."""
        if not self._pipelined or self._awaiting_room:
            return 1
        return max(self._depth - self._unfinished_batches(), 1)

    def _unfinished_batches(self) -> int:
        """Batches handed to the worker that it has not finished (finished ones stay until _settle)."""
        return sum(1 for future in self._pipeline if not future.done())

    def take_unfinished(self) -> asyncio.Future[Any] | None:
        """After a cancelled execute_requests: the batch the worker still runs (None if none)."""
        unfinished, self._unfinished = self._unfinished, None
        return unfinished

    def healthy(self) -> bool:
        session = self._serving
        if session is None or not session.alive or self._closing:
            return False
        if not session.info.get("has_is_ready"):
            return True
        self._refresh_ready(session)
        return self._ready_value

    def _refresh_ready(self, session: WorkerSession) -> None:
        """model.is_ready() runs in the worker; health reports its latest answer (refreshed at most every second)."""
        if self._ready_task is not None or time.monotonic() - self._ready_checked < READY_CHECK_INTERVAL:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._start_ready_check(session)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._start_ready_check, session)

    def _start_ready_check(self, session: WorkerSession) -> None:
        if self._ready_task is not None:
            return

        async def check() -> None:
            try:
                self._ready_value = await session.check_ready()
                self._ready_checked = time.monotonic()
            finally:
                self._ready_task = None

        self._ready_task = asyncio.get_running_loop().create_task(check())

    async def aclose(self) -> None:
        """Run finalize in the worker and end it (killed after stub-timeout-seconds)."""
        self._closing = True
        if self._restarter is not None and not self._restarter.done():
            self._restarter.cancel()
        for session in (self._serving, self._starting):
            if session is not None:
                await session.finalize(self._stub_timeout)
        self._serving = None
        self._resubmit(None)


async def start_process_instance(source: ModelSource, spec: InstanceSpec, host: str = PYTHON_HOST) -> ProcessInstance:
    """Spawn the instance's worker and wait for its initialize (or model load); a failure there fails the load."""
    loop = asyncio.get_running_loop()
    launch = await loop.run_in_executor(None, launch_for, source.config, source.model_dir)
    verbose = 1 if log.isEnabledFor(logging.DEBUG) else 0
    instance = ProcessInstance(source, spec, launch, verbose, host)
    await instance.start()
    return instance
