"""The execution policies: when an execution runs inline on the event loop, the hard cap, the settings."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import ExecutionBatch
from naiad.config.inline_settings import DEFAULT_CAP_US, DEFAULT_THRESHOLD_US, InlineSettings, inline_settings
from naiad.config.model_config import ConfigError
from naiad.config.validation import validate_config
from naiad.observability.statistics import ModelStatistics
from naiad.protocol.types import InferenceRequest
from naiad.runtime.thread_instance import InstancePool, ThreadInstance
from naiad.scheduling.base import WorkItem
from naiad.scheduling.direct import DirectScheduler
from naiad.scheduling.dynamic_batcher import DynamicBatcher
from naiad.scheduling.execution_policy import InlinePolicy, runs_at_once

MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _settle_inline(policy: InlinePolicy) -> None:
    """Executions measured cheap on the instance thread bring the average under the threshold."""
    for _ in range(40):
        policy.observe_thread(1_000)


def test_a_new_model_starts_on_its_threads_and_goes_inline_once_measured_cheap() -> None:
    policy = InlinePolicy()
    assert not policy.inline()
    _settle_inline(policy)
    assert policy.inline()
    for _ in range(40):
        policy.observe_thread(DEFAULT_THRESHOLD_US * 1000 * 3)
    assert not policy.inline()


def test_a_model_about_the_threshold_stays_where_it_runs_until_its_average_leaves_the_band() -> None:
    """Inline, a model leaves the loop only past 1.5x the threshold; on its threads, it comes back only
    under the threshold: executions averaging between the two do not flap between loop and threads."""
    threshold = 100_000
    inline = InlinePolicy(InlineSettings(threshold_ns=threshold))
    _settle_inline(inline)
    assert inline.inline()
    for _ in range(60):
        inline.observe_inline(int(threshold * 1.3), 0)
        assert inline.inline()  # 1.3x: still inline
    for _ in range(60):
        inline.observe_inline(int(threshold * 1.6), 0)
    assert not inline.inline()  # past 1.5x: on its threads
    for _ in range(60):
        inline.observe_thread(int(threshold * 1.3))
        assert not inline.inline()  # 1.3x measured on the threads: stays there
    for _ in range(60):
        inline.observe_thread(int(threshold * 0.8))
    assert inline.inline()


def test_an_inline_execution_over_the_cap_suspends_inline_execution_doubling_each_time() -> None:
    clock = FakeClock()
    policy = InlinePolicy(InlineSettings(threshold_ns=100_000, cap_ns=5 * MS), "m", clock)
    _settle_inline(policy)
    policy.observe_inline(4 * MS, 0)  # slow but under the cap: no suspension, only the average moves
    assert policy.suspensions == 0
    _settle_inline(policy)
    policy.observe_inline(50 * MS, 1 * MS)  # over the cap in wall time only: the server was paused
    assert policy.suspensions == 0
    _settle_inline(policy)
    assert policy.inline()

    suspended_for = []
    for _ in range(8):
        policy.observe_inline(6 * MS, 6 * MS)
        start = clock.now
        _settle_inline(policy)  # cheap again on the threads: the suspension alone keeps it off the loop
        while not policy.inline():
            clock.now += 250 * MS
        suspended_for.append((clock.now - start) // 1000 // MS)
    assert suspended_for == [1, 2, 4, 8, 16, 32, 64, 64]
    assert policy.suspensions == 8


def test_threshold_zero_never_runs_inline() -> None:
    policy = InlinePolicy(InlineSettings(threshold_ns=0))
    for _ in range(100):
        policy.observe_thread(0)
    assert not policy.inline()


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m"\n' + text, mc.ModelConfig())


def test_settings_come_from_the_model_config_parameters() -> None:
    assert inline_settings(_config("")) == InlineSettings(DEFAULT_THRESHOLD_US * 1000, DEFAULT_CAP_US * 1000)
    settings = inline_settings(_config(
        'parameters { key: "inline_threshold_us" value { string_value: "0" } }\n'
        'parameters { key: "inline_cap_us" value { string_value: " 2500 " } }'))
    assert settings == InlineSettings(threshold_ns=0, cap_ns=2_500_000)


@pytest.mark.parametrize(("key", "value"), [
    ("inline_threshold_us", "-1"), ("inline_threshold_us", "fast"), ("inline_cap_us", "0"), ("inline_cap_us", "1.5"),
])
def test_a_bad_setting_is_a_config_error_naming_the_parameter(key: str, value: str) -> None:
    """Checked with the rest of the config, before any instance exists (and by `naiad repo lint`)."""
    text = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
    with pytest.raises(ConfigError) as info:
        validate_config(_config(text), "m/config.pbtxt", 'name: "m"\n' + text)
    assert str(info.value) == (f"m/config.pbtxt:2: field 'parameters': parameter '{key}' must be a whole number "
                               f"of microseconds >= {1 if key == 'inline_cap_us' else 0}, got '{value}'")


def test_zero_delay_policy_applies_without_delay_or_ordering() -> None:
    assert runs_at_once(mc.ModelDynamicBatching())
    assert not runs_at_once(mc.ModelDynamicBatching(max_queue_delay_microseconds=1))
    assert not runs_at_once(mc.ModelDynamicBatching(preserve_ordering=True))


class ThreadRecorder:
    """Echoes X; records the thread each execution ran on; for an input of 9 computes (burns `slow_s`
    of CPU time), for 10 waits (sleeps `slow_s`)."""

    def __init__(self, slow_s: float) -> None:
        self.name = "rec_0"
        self.threads: list[int] = []
        self.slow_s = slow_s

    def execute(self, batch: ExecutionBatch) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        value = batch.inputs["X"][0, 0]
        if value == 9:
            end = time.thread_time() + self.slow_s
            while time.thread_time() < end:
                pass
        elif value == 10:
            time.sleep(self.slow_s)  # a slow execution that waits (releases the GIL), simulated
        return {"Y": batch.inputs["X"].copy()}

    def close(self) -> None:
        pass


def _item(value: float) -> WorkItem:
    return WorkItem({"X": np.full((1, 1), value, np.float32)}, ["Y"], 1, request=InferenceRequest(model_name="m", inputs=[]))


async def _execute_until_inline(runner: DirectScheduler | DynamicBatcher, model: ThreadRecorder) -> None:
    """Cheap executions until one runs on the loop's thread. About 12 bring the starting average under the
    threshold; the bound leaves room for a busy machine, where an execution can now and then be charged
    a few milliseconds of its thread's CPU (a garbage collection, a page fault) and delay the moment."""
    loop_thread = threading.get_ident()
    for value in range(300):
        assert (await runner.enqueue(_item(value % 8))).outputs["Y"][0, 0] == value % 8
        if model.threads[-1] == loop_thread:
            return
    pytest.fail("300 cheap executions and none ran on the event loop")


@pytest.mark.parametrize("scheduler", ["direct", "dynamic zero delay"])
def test_a_slow_inline_execution_sends_the_model_back_to_its_thread(scheduler: str) -> None:
    """End to end through a scheduler: cheap executions run on the loop's thread; one over the cap
    (400 ms of CPU time against a 200 ms cap) sends the next ones to the instance thread, even though
    the thread measures them cheap again."""

    async def body() -> None:
        loop_thread = threading.get_ident()
        model = ThreadRecorder(slow_s=0.4)
        pool = InstancePool([ThreadInstance(model)])
        policy = InlinePolicy(InlineSettings(threshold_ns=100_000, cap_ns=200 * MS), "m")
        stats = ModelStatistics("m", "1")
        runner = (DirectScheduler(pool, stats, True, policy) if scheduler == "direct"
                  else DynamicBatcher(pool, stats, 8, mc.ModelDynamicBatching(), inline=policy))
        try:
            await _execute_until_inline(runner, model)  # measured cheap: now inline
            assert (await runner.enqueue(_item(9))).outputs["Y"][0, 0] == 9
            assert model.threads[-1] == loop_thread and policy.suspensions == 1
            # 60 executions: enough for the average alone to fall back under the threshold (about 35).
            for value in range(60):
                await runner.enqueue(_item(value % 8))
            assert loop_thread not in model.threads[-60:]  # suspended for 1 s: all on the instance thread
            assert runner.inflight() == 0
        finally:
            await runner.stop()
            await pool.close()

    asyncio.run(body())


def test_an_inline_execution_that_waits_goes_back_to_the_thread_by_its_average_without_a_suspension() -> None:
    """Over the cap in wall time but not in the loop's CPU time (it waited, as a paused server does):
    no suspension, but its wall time enters the average, so the next executions run on the thread."""

    async def body() -> None:
        loop_thread = threading.get_ident()
        model = ThreadRecorder(slow_s=0.3)
        pool = InstancePool([ThreadInstance(model)])
        policy = InlinePolicy(InlineSettings(threshold_ns=100_000, cap_ns=200 * MS), "m")
        runner = DirectScheduler(pool, ModelStatistics("m", "1"), True, policy)
        try:
            await _execute_until_inline(runner, model)
            await runner.enqueue(_item(10))
            assert model.threads[-1] == loop_thread and policy.suspensions == 0
            await runner.enqueue(_item(1))
            assert model.threads[-1] != loop_thread
        finally:
            await pool.close()

    asyncio.run(body())
