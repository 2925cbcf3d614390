"""CPU, memory, pinned-memory and (when NVML is present) GPU gauges, sampled every --metrics-interval-ms.

Triton refreshes these "per interval" families from a background thread, so a scrape returns the
last sample and `nv_cpu_utilization` covers the last interval. Here `run` is that loop, a task
the Server starts with the listeners and cancels at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from types import ModuleType

from naiad.observability.exposition import Family

log = logging.getLogger("naiad.metrics")


def read_cpu_times() -> tuple[int, int] | None:
    """(total, idle) jiffies from the aggregate line of /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values), idle


def read_meminfo() -> dict[str, int]:
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    info[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return info


class SystemMetrics:
    """The per-interval families; `sample` reads the OS, `families` returns the last sample."""

    def __init__(
        self, cpu_metrics: bool = True, gpu_metrics: bool = True,
        read_cpu: Callable[[], tuple[int, int] | None] | None = None,
        read_memory: Callable[[], dict[str, int]] | None = None,
        read_gpus: Callable[[], list[Family]] | None = None,
    ) -> None:
        self._cpu = cpu_metrics
        self._read_cpu = read_cpu or read_cpu_times
        self._read_memory = read_memory or read_meminfo
        self._read_gpus = (read_gpus or GpuReader()) if gpu_metrics else None
        self._lock = threading.Lock()
        self._last_cpu = self._read_cpu() if cpu_metrics else None
        self._families: list[Family] | None = None
        self.samples = 0  # how many times the OS was read (tests watch it)

    def sample(self) -> None:
        """Read everything once; utilisation is the busy share since the previous sample."""
        families = [_pinned("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes"),
                    _pinned("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes")]
        if self._cpu:
            now = self._read_cpu()
            previous, self._last_cpu = self._last_cpu, now
            utilisation = 0.0
            if now and previous and now[0] > previous[0]:
                busy = (now[0] - previous[0]) - (now[1] - previous[1])
                utilisation = max(0.0, min(1.0, busy / (now[0] - previous[0])))
            cpu = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
            cpu.add({}, utilisation)
            memory = self._read_memory()
            total = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
            total.add({}, memory.get("MemTotal", 0))
            used = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
            used.add({}, max(memory.get("MemTotal", 0) - memory.get("MemAvailable", 0), 0))
            families += [cpu, total, used]
        if self._read_gpus is not None:
            families += self._read_gpus()
        with self._lock:
            self._families = families
            self.samples += 1

    def families(self) -> list[Family]:
        with self._lock:
            cached = self._families
        if cached is None:  # scraped before the first interval ran (or no sampler, in-process use)
            self.sample()
            with self._lock:
                cached = self._families or []
        return cached

    async def run(self, interval_secs: float) -> None:
        """Sample now and then every interval until cancelled (NVML calls run off the event loop)."""
        while True:
            try:
                if self._read_gpus is not None:
                    await asyncio.to_thread(self.sample)
                else:
                    self.sample()
            except Exception:  # a failed reading keeps the previous sample and the loop alive
                log.exception("system metrics sample failed")
            await asyncio.sleep(interval_secs)


def _pinned(name: str, help_text: str) -> Family:
    # Naiad has no pinned host-memory pool (no CUDA), so both gauges are 0, as the spec asks of CPU-only servers.
    family = Family(name, "gauge", help_text)
    family.add({}, 0)
    return family


class GpuReader:
    """GPU gauges through pynvml; nothing when pynvml or a driver is missing (as Triton without GPUs)."""

    def __init__(self) -> None:
        self._energy_start: dict[str, float] = {}

    def __call__(self) -> list[Family]:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except Exception:
            return []
        try:
            return self._read(pynvml)
        except Exception:
            return []
        finally:
            pynvml.nvmlShutdown()

    def _read(self, pynvml: ModuleType) -> list[Family]:
        util = Family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)")
        mem_total = Family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes")
        mem_used = Family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes")
        power = Family("nv_gpu_power_usage", "gauge", "GPU power usage in watts")
        limit = Family("nv_gpu_power_limit", "gauge", "GPU power management limit in watts")
        energy = Family("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started")
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            labels = {"gpu_uuid": uuid}
            util.add(labels, pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            mem_total.add(labels, info.total)
            mem_used.add(labels, info.used)
            power.add(labels, pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            limit.add(labels, pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0)
            try:
                joules = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0  # millijoules since driver load
            except Exception:
                continue
            start = self._energy_start.setdefault(uuid, joules)
            energy.add(labels, joules - start)
        return [util, mem_total, mem_used, power, limit] + ([energy] if energy.samples else [])
