"""CPU, memory and (when NVML is present) GPU gauges, read from the OS at scrape time."""

from __future__ import annotations

import threading

from naiad.observability.exposition import Family


def _read_cpu_times() -> tuple[int, int] | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values), idle


def _read_meminfo() -> dict[str, int]:
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
    """nv_cpu_* gauges (utilisation since the previous scrape) and nv_gpu_* through pynvml."""

    def __init__(self, gpu_metrics: bool = True) -> None:
        self._last = _read_cpu_times()
        self._lock = threading.Lock()
        self._gpu = gpu_metrics

    def families(self) -> list[Family]:
        families = []
        now = _read_cpu_times()
        with self._lock:
            previous, self._last = self._last, now
        utilisation = 0.0
        if now and previous and now[0] > previous[0]:
            busy = (now[0] - previous[0]) - (now[1] - previous[1])
            utilisation = max(0.0, min(1.0, busy / (now[0] - previous[0])))
        cpu = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
        cpu.add({}, utilisation)
        memory = _read_meminfo()
        total = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
        total.add({}, memory.get("MemTotal", 0))
        used = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
        used.add({}, max(memory.get("MemTotal", 0) - memory.get("MemAvailable", 0), 0))
        families += [cpu, total, used]
        if self._gpu:
            families += _gpu_families()
        return families


def _gpu_families() -> list[Family]:
    """GPU gauges when pynvml and a driver are present; nothing otherwise (as Triton without GPUs)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        util = Family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)")
        mem_total = Family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes")
        mem_used = Family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes")
        power = Family("nv_gpu_power_usage", "gauge", "GPU power usage in watts")
        limit = Family("nv_gpu_power_limit", "gauge", "GPU power management limit in watts")
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            labels = {"gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid}
            util.add(labels, pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            mem_total.add(labels, info.total)
            mem_used.add(labels, info.used)
            power.add(labels, pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
            limit.add(labels, pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0)
        return [util, mem_total, mem_used, power, limit]
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()
