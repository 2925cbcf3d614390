"""Dynamic batcher behaviour: preferred sizes, delay, priorities, queue size, timeouts, ordering."""

import asyncio
import statistics
import threading
import time

import numpy as np
import pytest
import uvloop
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.errors import ErrorCode, NaiadError
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool, ThreadInstance
from naiad.scheduling.base import WorkItem
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from tests.support.timing import quietest_median


class RecordingInstance:
    """A backend instance that echoes X as Y, records batch sizes, and can be held at a gate."""

    def __init__(self) -> None:
        self.name = "rec_0"
        self.batches: list[list[float]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.delays: dict[float, float] = {}

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        self.gate.wait(10)
        values = batch.inputs["X"][:, 0].tolist()
        self.batches.append(values)
        for v in values:
            if v in self.delays:
                time.sleep(self.delays[v])  # a slow execution, simulated
        return {"Y": batch.inputs["X"].copy()}

    def close(self) -> None:
        pass


def _config(**kw) -> mc.ModelDynamicBatching:
    policy = kw.pop("policy", None)
    levels = kw.pop("levels", None)
    cfg = mc.ModelDynamicBatching(**kw)
    if policy:
        cfg.default_queue_policy.CopyFrom(policy)
    if levels:
        cfg.priority_levels = levels
        cfg.default_priority_level = levels
    return cfg


def _item(value: float, priority: int = 0, timeout_us: int = 0) -> WorkItem:
    request = InferenceRequest(model_name="m", inputs=[], priority=priority, timeout_us=timeout_us)
    return WorkItem({"X": np.full((1, 1), value, np.float32)}, ["Y"], 1, request=request)


async def _with_batcher(config, body, max_batch_size=8, instances=1):
    recs = [RecordingInstance() for _ in range(instances)]
    pool = InstancePool([ThreadInstance(r) for r in recs])
    batcher = DynamicBatcher(pool, ModelStatistics("m", "1"), max_batch_size, config)
    try:
        return await body(batcher, recs[0])
    finally:
        await batcher.stop()
        await pool.close()


async def _until_executing(batcher) -> None:
    """Until the one request enqueued has left the queue for the instance."""
    await asyncio.sleep(0)
    for _ in range(1000):
        if batcher.pending() == 0 and batcher.inflight() == 1:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the request never left the queue")


def run(coro):
    return asyncio.run(coro)


def test_requests_queued_behind_a_busy_instance_form_one_batch():
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(batcher.enqueue(_item(v))) for v in (1, 2, 3)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        results = await asyncio.gather(first, *rest)
        assert [r.outputs["Y"][0, 0] for r in results] == [0, 1, 2, 3]
        return rec.batches

    batches = run(_with_batcher(_config(), body))
    assert batches == [[0.0], [1.0, 2.0, 3.0]]


def test_preferred_size_cuts_the_batch():
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(batcher.enqueue(_item(v))) for v in (1, 2, 3, 4, 5)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(first, *rest)
        return rec.batches

    batches = run(_with_batcher(_config(preferred_batch_size=[2, 4]), body))
    assert batches[1] == [1.0, 2.0, 3.0, 4.0] and batches[2] == [5.0]


def test_queue_delay_waits_for_more_requests():
    async def body(batcher, rec):
        tasks = [asyncio.create_task(batcher.enqueue(_item(0)))]
        await asyncio.sleep(0.02)
        tasks.append(asyncio.create_task(batcher.enqueue(_item(1))))
        await asyncio.gather(*tasks)
        return rec.batches

    batches = run(_with_batcher(_config(max_queue_delay_microseconds=300_000), body))
    assert batches == [[0.0, 1.0]]


def test_max_queue_size_rejects_with_unavailable():
    policy = mc.ModelQueuePolicy(max_queue_size=1)

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.05)  # executing, queue empty
        second = asyncio.create_task(batcher.enqueue(_item(1)))
        await asyncio.sleep(0.01)
        with pytest.raises(NaiadError) as err:
            await batcher.enqueue(_item(2))
        rec.gate.set()
        await asyncio.gather(first, second)
        return err.value

    error = run(_with_batcher(_config(policy=policy), body))
    assert error.code is ErrorCode.UNAVAILABLE and error.message == "Exceeds maximum queue size"


def test_timeout_rejects_on_time_even_when_no_batch_forms():
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=100_000)

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.02)
        started = time.monotonic()
        with pytest.raises(NaiadError) as err:
            await batcher.enqueue(_item(1))
        waited = time.monotonic() - started
        rec.gate.set()
        await first
        return err.value, waited

    error, waited = run(_with_batcher(_config(policy=policy), body))
    assert error.code is ErrorCode.UNAVAILABLE and error.message == "Request timeout expired"
    assert waited < 2.0  # fired by its timer while the instance was still busy


def test_request_timeout_override_only_when_allowed():
    strict = mc.ModelQueuePolicy(allow_timeout_override=False)
    allowed = mc.ModelQueuePolicy(allow_timeout_override=True)

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(batcher.enqueue(_item(1, timeout_us=20_000)))
        await asyncio.sleep(0.15)
        rec.gate.set()
        await first
        try:
            await second
            return "served"
        except NaiadError as exc:
            return exc.message

    assert run(_with_batcher(_config(policy=strict), body)) == "served"
    assert run(_with_batcher(_config(policy=allowed), body)) == "Request timeout expired"


def test_delay_action_batches_expired_requests_last():
    # Item 2 overrides the 20 ms timeout with 60 s: on a loaded machine it must not expire too
    # before the gate opens (that would put it in the delayed list behind item 1).
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=20_000, timeout_action=mc.ModelQueuePolicy.DELAY,
                                 allow_timeout_override=True)

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await _until_executing(batcher)
        late = asyncio.create_task(batcher.enqueue(_item(1)))
        for _ in range(1000):  # until item 1's timer fired and moved it to the delayed list
            if any(level.delayed for level in batcher._levels):
                break
            await asyncio.sleep(0.005)
        fresh = asyncio.create_task(batcher.enqueue(_item(2, timeout_us=60_000_000)))
        for _ in range(1000):  # until item 2 waits in the queue beside the delayed item 1
            if batcher.pending() == 2:
                break
            await asyncio.sleep(0.005)
        rec.gate.set()
        await asyncio.gather(first, late, fresh)
        return rec.batches

    batches = run(_with_batcher(_config(policy=policy), body, max_batch_size=1))
    assert batches == [[0.0], [2.0], [1.0]]


def test_priorities_served_highest_first():
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.02)
        low = asyncio.create_task(batcher.enqueue(_item(1, priority=2)))
        default = asyncio.create_task(batcher.enqueue(_item(2, priority=0)))  # default level = 2
        high = asyncio.create_task(batcher.enqueue(_item(3, priority=1)))
        beyond = asyncio.create_task(batcher.enqueue(_item(4, priority=9)))  # beyond levels -> default
        await asyncio.sleep(0.01)
        rec.gate.set()
        await asyncio.gather(first, low, default, high, beyond)
        return rec.batches

    batches = run(_with_batcher(_config(levels=2), body, max_batch_size=1))
    assert batches == [[0.0], [3.0], [1.0], [2.0], [4.0]]


def test_preserve_ordering_releases_in_arrival_order():
    async def body(batcher, rec):
        done: list[float] = []

        async def call(v):
            await batcher.enqueue(_item(v))
            done.append(v)

        rec.delays = {0.0: 0.2}
        await asyncio.gather(call(0.0), call(1.0))
        return done

    order = run(_with_batcher(_config(preserve_ordering=True), body, max_batch_size=1, instances=2))
    assert order == [0.0, 1.0]


def test_cancelled_request_is_not_executed():
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.02)
        doomed = asyncio.create_task(batcher.enqueue(_item(1)))
        await asyncio.sleep(0.01)
        doomed.cancel()
        await asyncio.sleep(0.01)
        rec.gate.set()
        await first
        kept = await batcher.enqueue(_item(2))
        assert kept.outputs["Y"][0, 0] == 2
        return rec.batches

    batches = run(_with_batcher(_config(), body))
    assert [1.0] not in batches and all(1.0 not in b for b in batches)


def test_batches_record_what_closed_them():
    stats_holder = {}

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))  # idle instance: runs at once
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(batcher.enqueue(_item(v))) for v in (1, 2, 3, 4, 5)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(first, *rest)
        stats_holder["closed"] = dict(batcher._stats.batches_closed)
        stats_holder["sizes"] = batcher._stats.batch_sizes()

    run(_with_batcher(_config(preferred_batch_size=[2, 4]), body))
    assert stats_holder["closed"] == {"idle_instance": 1, "preferred": 1, "no_delay": 1}
    assert stats_holder["sizes"] == {1: 2, 4: 1}


@pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_sub_millisecond_queue_delay_is_kept(runner):
    # 500 us: the loop's timers round it to whole milliseconds (asyncio waits >= 1 ms; uvloop
    # fires at once and the batcher polled until due, spending the whole wait on the CPU).
    requests = 200

    async def body():
        recs = [RecordingInstance()]
        pool = InstancePool([ThreadInstance(r) for r in recs])
        batcher = DynamicBatcher(pool, ModelStatistics("m", "1"), 8, _config(max_queue_delay_microseconds=500))
        waits = []
        cpu_start = time.thread_time_ns()  # the loop's thread only
        try:
            for v in range(requests):
                item = _item(v)
                await batcher.enqueue(item)
                waits.append(item.dispatch_ns - item.enqueue_ns)
            cpu = time.thread_time_ns() - cpu_start
        finally:
            await batcher.stop()
            await pool.close()
        return waits, cpu

    waits, cpu = runner(body())
    assert min(waits) >= 500_000  # a lone request waits the whole delay for company
    assert quietest_median(waits) < 750_000  # ... and not much longer
    assert cpu / requests < 300_000  # ... asleep (measured: 50-100 us of loop CPU a request)


def test_closed_loop_clients_fill_batches_within_the_queue_delay():
    clients, rounds = 32, 25

    async def body(batcher, rec):
        async def client(index):
            for _ in range(rounds):
                await batcher.enqueue(_item(index))

        await asyncio.gather(*(client(i) for i in range(clients)))
        return batcher._stats.batch_sizes()

    sizes = run(_with_batcher(_config(max_queue_delay_microseconds=2000), body, max_batch_size=32))
    executions = [size for size, count in sizes.items() for _ in range(count)]
    assert sum(executions) == clients * rounds
    assert statistics.median(executions) >= 24, sizes


def test_closed_loop_clients_answered_together_rejoin_the_next_batch():
    """Nine clients, batches of at most eight, executions longer than the queue delay: the request
    left over from a batch waits past its delay during the next execution. When the instance frees
    up, the eight clients just answered send again a loop turn later (as a request read from a
    socket does); they join the left-over request's batch instead of letting it go alone (which
    made batches of 8 and 1 alternate)."""
    clients, rounds = 9, 12

    async def body(batcher, rec):
        rec.delays = {float(index): 0.003 for index in range(clients)}

        async def client(index):
            for _ in range(rounds):
                await batcher.enqueue(_item(index))
                await asyncio.sleep(0)  # the next request arrives a loop turn after the answer

        await asyncio.gather(*(client(i) for i in range(clients)))
        return [len(batch) for batch in rec.batches]

    sizes = run(_with_batcher(_config(max_queue_delay_microseconds=1000), body, max_batch_size=8))
    assert sum(sizes) == clients * rounds
    assert sizes.count(8) >= len(sizes) - 2, sizes  # full batches, but for the last ones


def test_largest_preferred_size_caps_the_batch_below_max_batch_size():
    # As Triton: max_batch_size is a preferred size only when none is configured.
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(batcher.enqueue(_item(v))) for v in range(1, 9)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(first, *rest)
        return rec.batches

    batches = run(_with_batcher(_config(preferred_batch_size=[4]), body))
    assert batches == [[0.0], [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]


def test_requests_past_the_queue_delay_go_as_one_batch_up_to_max_batch_size():
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await _until_executing(batcher)  # the lone first request waited its delay
        rest = [asyncio.create_task(batcher.enqueue(_item(v))) for v in range(1, 7)]
        await asyncio.sleep(0.1)  # twice the delay: the 6 queued requests are overdue
        rec.gate.set()
        await asyncio.gather(first, *rest)
        return rec.batches, dict(batcher._stats.batches_closed)

    batches, closed = run(_with_batcher(_config(preferred_batch_size=[4], max_queue_delay_microseconds=50_000), body))
    assert batches == [[0.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]
    assert closed == {"delay": 2}


def test_a_batch_that_cannot_grow_does_not_wait_for_the_delay():
    # The next queued request has another shape: waiting could not make the batch larger.
    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await _until_executing(batcher)
        small = asyncio.create_task(batcher.enqueue(_item(1)))
        wide = WorkItem({"X": np.full((1, 2), 2, np.float32)}, ["Y"], 1, request=InferenceRequest(model_name="m", inputs=[]))
        other = asyncio.create_task(batcher.enqueue(wide))
        await asyncio.sleep(0.01)
        opened = time.monotonic()
        rec.gate.set()
        await small
        small_after = time.monotonic() - opened
        await asyncio.gather(first, other)
        return rec.batches, small_after

    batches, small_after = run(_with_batcher(_config(max_queue_delay_microseconds=1_500_000), body))
    assert batches == [[0.0], [1.0], [2.0]]
    assert small_after < 1.0  # not held for the 1.5 s delay


def test_sub_millisecond_queue_timeout_is_kept():
    policy = mc.ModelQueuePolicy(default_timeout_microseconds=700)

    async def body(batcher, rec):
        rec.gate.clear()
        first = asyncio.create_task(batcher.enqueue(_item(0)))
        await _until_executing(batcher)
        waits = []
        for v in range(1, 151):
            item = _item(v)
            with pytest.raises(NaiadError, match="Request timeout expired"):
                await batcher.enqueue(item)
            waits.append(time.perf_counter_ns() - item.enqueue_ns)
        rec.gate.set()
        await first
        return waits

    waits = run(_with_batcher(_config(policy=policy), body))
    assert min(waits) >= 700_000
    assert quietest_median(waits) < 1_000_000  # the loop's timers: >= 1 ms
