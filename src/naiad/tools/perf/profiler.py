"""The coordinator: prepares requests, drives the load processes level by level, cuts measurement windows."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from naiad.tools.errors import ToolError
from naiad.tools.perf.inputs import InputData, build_input_data, output_byte_size, parse_shapes
from naiad.tools.perf.load_manager import LoadError, LoadManager
from naiad.tools.perf.measurement import END, WindowStats, empty_records, is_stable, merge_windows, summarize_window
from naiad.tools.perf.options import PerfOptions
from naiad.tools.perf.payloads import RequestOptions, grpc_payload, http_template, parse_request_parameter, render_http
from naiad.tools.perf.probe import wrong_endpoint
from naiad.tools.perf.progress import ProgressLine
from naiad.tools.perf.report import LevelResult, print_level, print_summary, write_csv, write_json
from naiad.tools.perf.sequences import SequenceSpec
from naiad.tools.perf.server_metrics import MetricsCollector, metrics_url
from naiad.tools.perf.shm import SystemShmRegions
from naiad.tools.perf.worker import WorkerSpec
from naiad.tools.v2client import ModelInfo, ServerError, StatsSnapshot, control_client, model_info, split_url

POLL_S = 0.25
COUNT_WINDOW_LIMIT_S = 120.0
WARMUP_LIMIT_S = 120.0
DRAIN_S = 30.0


class PerfError(ToolError):
    """The run cannot go on (bad options, server error); the message is for the user."""


@dataclass
class ProfileResult:
    levels: list[LevelResult] = field(default_factory=list)
    client_completed: int = 0  # every request that completed during the run (warm-up and drain included)
    server_delta: StatsSnapshot | None = None  # the server's counters over the whole run

    def totals(self) -> dict[str, int]:
        doc = {"client_request_count": self.client_completed}
        if self.server_delta is not None:
            doc["server_request_count"] = self.server_delta.success_count
            doc["server_inference_count"] = self.server_delta.inference_count
            doc["server_execution_count"] = self.server_delta.execution_count
        return doc


class Profiler:
    def __init__(self, options: PerfOptions, out: TextIO | None = None, err: TextIO | None = None,
                 stop_when: Callable[[list[LevelResult]], bool] | None = None) -> None:
        self.options = options
        self.stop_when = stop_when  # extra early stop for a sweep (the analyzer's)
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.progress = ProgressLine(options.progress, self.err)
        self.control = control_client(options.protocol, options.resolved_url())
        self.has_stats = True
        self.manager: LoadManager | None = None
        self.completed = 0
        self.metrics = (MetricsCollector(metrics_url(options.metrics_url, options.resolved_url()),
                                         options.metrics_interval_ms, self.err) if options.collect_metrics else None)

    # ------------------------------------------------------------------ set-up
    def _model(self) -> ModelInfo:
        o = self.options
        host, port = split_url(o.resolved_url(), 8001 if o.protocol == "grpc" else 8000)
        problem = wrong_endpoint(host, port, o.protocol)
        if problem:
            raise PerfError(problem)
        try:
            if not self.control.model_ready(o.model, o.version):
                raise PerfError(f"model '{o.model}' is not ready on {o.resolved_url()} (is it in the repository and "
                                "loaded? GET /v2/repository/index lists the models)")
            return model_info(self.control, o.model, o.version)
        except (ServerError, OSError) as exc:
            raise PerfError(f"cannot read model '{o.model}' from {o.resolved_url()}: {exc}") from None

    def _payloads(self, info: ModelInfo, shm: SystemShmRegions | None) -> tuple[list[bytes], list[Any], InputData]:
        """Request bytes per input set, the templates sequence requests are rendered from, and the data."""
        o = self.options
        try:
            data = build_input_data(info, o.batch_size, o.input_data, parse_shapes(o.shapes),
                                    o.string_length, o.string_data, o.seed)
            params = dict(parse_request_parameter(p) for p in o.request_parameters)
        except ValueError as exc:
            raise PerfError(str(exc)) from None
        request = RequestOptions(o.model, o.version, params, o.headers, info.decoupled)
        layout = None
        if shm is not None:
            batched = info.max_batch_size > 0
            sizes = {s.name: output_byte_size(s, batched, o.batch_size, o.output_shared_memory_size) for s in info.outputs}
            layout = shm.build(data.sets, sizes)
        host, port = split_url(o.resolved_url(), 8001 if o.protocol == "grpc" else 8000)
        payloads: list[bytes] = []
        templates: list[Any] = []
        for index, tensors in enumerate(data.sets):
            shm_in = layout.inputs[index] if layout else None
            shm_out = layout.outputs if layout else None
            if o.protocol == "grpc":
                payloads.append(grpc_payload(info, tensors, request, shm_in, shm_out, o.streaming))
                templates.append(payloads[-1])
            else:
                templates.append(http_template(host, port, info, tensors, request, shm_in, shm_out))
                payloads.append(render_http(templates[-1]))
        return payloads, templates, data

    def _sequence_spec(self, info: ModelInfo, data: InputData) -> SequenceSpec | None:
        """perf_analyzer's sequence options for a model with a sequence batcher (None for other models)."""
        o = self.options
        batcher = info.config.get("sequence_batching")
        if batcher is None:
            return None
        user_data = o.input_data not in ("zero", "random", ["zero"], ["random"])
        length = o.sequence_length or (0 if user_data else 20)
        start, end = o.sequence_id_range
        spec = SequenceSpec(data.streams, length, o.sequence_length_variation, start, end, o.num_of_sequences,
                            o.serial_sequences, _string_correlation_ids(batcher))
        live = o.num_of_sequences if o.mode == "rate" else int(max(o.levels()))
        if live > spec.id_capacity():
            raise PerfError(f"--sequence-id-range {start}:{end} holds {spec.id_capacity()} ids, fewer than the "
                            f"{live} sequences that can be live at once: widen the range")
        if end and o.process_count() > 1 and live > spec.id_capacity() // o.process_count():
            raise PerfError(f"--sequence-id-range {start}:{end} is too small to share among "
                            f"{o.process_count()} load processes: widen it or pass --processes 1")
        return spec

    def _stats(self) -> StatsSnapshot | None:
        if not self.has_stats:
            return None
        try:
            return self.control.stats(self.options.model, self.options.version)
        except (ServerError, OSError) as exc:
            self.has_stats = False
            print(f"Warning: no server-side statistics ({exc}); reporting client-side numbers only", file=self.err)
            return None

    def _mark(self) -> tuple[int, StatsSnapshot | None]:
        """A window boundary: the time half-way through the statistics call, and the statistics."""
        before = time.monotonic_ns()
        stats = self._stats()
        return (before + time.monotonic_ns()) // 2, stats

    # ------------------------------------------------------------------ load
    def _flush(self) -> np.ndarray:
        assert self.manager is not None
        records, errors, first_error = self.manager.flush()
        self.completed += len(records)
        if errors:
            raise PerfError(f"{errors} request(s) failed: {first_error}")
        return records

    def _level_spec(self, value: float) -> dict[str, Any]:
        o = self.options
        if o.mode == "concurrency":
            return {"mode": "concurrency", "concurrency": int(value)}
        return {"mode": "rate", "rate": value, "distribution": o.request_distribution,
                "intervals_ns": o.request_intervals_ns}

    def _warmup(self) -> None:
        count = self.options.warmup_request_count
        if count <= 0:
            return
        assert self.manager is not None
        self.manager.start(self._level_spec(self.options.levels()[0]))
        done, deadline = 0, time.monotonic() + WARMUP_LIMIT_S
        while done < count and time.monotonic() < deadline:
            time.sleep(0.05)
            done += len(self._flush())
            self.progress.update(f"warm-up: {done}/{count} requests")
        records, errors, first_error = self.manager.stop(DRAIN_S)
        self.completed += len(records)
        if errors:
            raise PerfError(f"{errors} warm-up request(s) failed: {first_error}")

    def _wait_window(self, t0: int, carry: np.ndarray, label: str, trial: int) -> np.ndarray:
        """Sleep through one window, flushing to keep the progress line live; returns the carried records."""
        o = self.options
        target = o.request_count or o.measurement_request_count
        count_mode = o.request_count > 0 or o.measurement_mode == "count_windows"
        limit = COUNT_WINDOW_LIMIT_S if count_mode else o.measurement_interval_ms / 1000.0
        deadline = t0 + int(limit * 1e9)
        started = time.monotonic()
        while True:
            now = time.monotonic_ns()
            if now >= deadline:
                return carry
            poll_s = POLL_S if not count_mode else 0.02
            if self.metrics is not None:
                poll_s = min(poll_s, self.metrics.interval_ns / 1e9)
            time.sleep(min(poll_s, (deadline - now) / 1e9))
            if self.metrics is not None:
                self.metrics.poll()
            carry = np.concatenate([carry, self._flush()])
            in_window = int((carry[:, END] >= t0).sum())
            elapsed = max(time.monotonic() - started, 1e-6)
            self.progress.update(f"{label} | window {trial} | {in_window} requests | "
                                 f"{in_window * o.batch_size / elapsed:.1f} infer/sec")
            if count_mode and in_window >= target:
                return carry

    def measure(self, value: float) -> LevelResult:
        """Run one load level until stable (or max trials) and return the merged last windows."""
        o = self.options
        assert self.manager is not None
        spec = self._level_spec(value)
        label = (f"concurrency {int(value)}" if o.mode == "concurrency"
                 else ("request intervals" if not value else f"rate {value:g}/s"))
        self.manager.start(spec)
        self.progress.update(f"{label} | measuring", force=True)
        windows: list[WindowStats] = []
        carry = empty_records()
        t_prev, stats_prev = self._mark()
        starts: list[int] = []
        stable = False
        trials = 1 if o.request_count > 0 else max(1, o.max_trials)
        try:
            for trial in range(1, trials + 1):
                starts.append(t_prev)
                carry = self._wait_window(t_prev, carry, label, trial)
                t_end, stats_now = self._mark()
                carry = np.concatenate([carry, self._flush()])
                delta = stats_now.minus(stats_prev) if stats_now and stats_prev else None
                window = summarize_window(carry, t_prev, t_end, o.batch_size, delta)
                carry = carry[carry[:, END] >= t_end]
                windows.append(window)
                if o.verbose:
                    self.progress.clear()
                    print(f"  Pass [{trial}] throughput: {window.throughput:.2f} infer/sec. "
                          f"{'Avg' if o.percentile <= 0 else f'p{o.percentile:g}'} latency: "
                          f"{int(window.latency_metric_us(o.percentile))} usec "
                          f"(std {int(window.std_latency_us())} usec)", file=self.out)
                if o.request_count > 0 or is_stable(windows, o.stability_percentage, o.percentile):
                    stable = True
                    break
                t_prev, stats_prev = t_end, stats_now
        finally:
            records, errors, first_error = self.manager.stop(DRAIN_S)
            self.completed += len(records)
        if errors:
            raise PerfError(f"{errors} request(s) failed: {first_error}")
        self.progress.clear()
        merged = merge_windows(windows[-3:] if o.request_count <= 0 else windows)
        if merged.count == 0:
            raise PerfError(f"no request completed at {label}: is the server answering?")
        result = LevelResult(o.mode, value, merged, windows, stable)
        if self.metrics is not None:
            reported = starts[-3] if o.request_count <= 0 and len(starts) >= 3 else starts[0]
            result.metrics = self.metrics.level(reported, t_end)
        return result

    # ------------------------------------------------------------------ sweeps
    def _over_threshold(self, result: LevelResult) -> bool:
        limit = self.options.latency_threshold_ms
        return limit > 0 and result.measurement.latency_metric_us(self.options.percentile) > limit * 1000.0

    def _report(self, result: LevelResult) -> LevelResult:
        print_level(result, self.options.percentile, self.out)
        self.out.flush()
        return result

    def sweep(self) -> list[LevelResult]:
        results = []
        for value in self.options.levels():
            result = self._report(self.measure(value))
            results.append(result)
            if self._over_threshold(result):
                print(f"Latency above the {self.options.latency_threshold_ms:g} ms threshold: sweep stopped", file=self.out)
                break
            if self.stop_when is not None and self.stop_when(results):
                break
        return results

    def binary_search(self) -> list[LevelResult]:
        """Largest load whose latency stays within the threshold (measured points are all reported)."""
        values = self.options.levels()
        results: dict[int, LevelResult] = {}

        def at(index: int) -> LevelResult:
            if index not in results:
                results[index] = self._report(self.measure(values[index]))
            return results[index]

        low, high = 0, len(values) - 1
        if not self._over_threshold(at(low)) and high > low and self._over_threshold(at(high)):
            for _ in range(64):  # log2 of any sweep length
                if high - low <= 1:
                    break
                mid = (low + high) // 2
                if self._over_threshold(at(mid)):
                    high = mid
                else:
                    low = mid
        return [results[i] for i in sorted(results)]

    def run(self) -> ProfileResult:
        o = self.options
        info = self._model()
        if o.streaming and o.protocol != "grpc":
            raise PerfError("--streaming needs -i grpc")
        if info.decoupled and not o.streaming:
            raise PerfError(f"model '{o.model}' is decoupled: use -i grpc --streaming")
        if info.decoupled:
            print("Detected decoupled model: latency is to the final response; the first response's latency "
                  "is reported beside it", file=self.out)
        shm = SystemShmRegions(self.control) if o.shared_memory == "system" else None
        result = ProfileResult()
        try:
            payloads, templates, data = self._payloads(info, shm)
            sequence = self._sequence_spec(info, data)
            host, port = split_url(o.resolved_url(), 8001 if o.protocol == "grpc" else 8000)
            spec = WorkerSpec(o.protocol, host, port, payloads, o.streaming, info.decoupled, o.max_connections, o.seed,
                              sequence=sequence, templates=templates if sequence else [])
            start_stats = self._stats()
            self.manager = LoadManager(spec, o.process_count())
            try:
                self._warmup()
                result.levels = self.binary_search() if o.binary_search else self.sweep()
            finally:
                self.manager.close()
                self.manager = None
                self.progress.clear()
            end_stats = self._stats()
            if start_stats is not None and end_stats is not None:
                result.server_delta = end_stats.minus(start_stats)
            result.client_completed = self.completed
        except (ServerError, LoadError) as exc:
            raise PerfError(str(exc)) from None
        finally:
            if shm is not None:
                shm.close()
            self.control.close()
        print_summary(result.levels, o.percentile, self.out)
        totals = result.totals()
        if "server_request_count" in totals:
            print(f"Total requests: client {totals['client_request_count']}, "
                  f"server {totals['server_request_count']}", file=self.out)
        if o.csv_file:
            write_csv(o.csv_file, result.levels, o.verbose_csv, info.decoupled)
        if o.json_file:
            write_json(o.json_file, result.levels, o.percentile, totals)
        return result


def run_perf(options: PerfOptions, out: TextIO | None = None, err: TextIO | None = None,
             stop_when: Callable[[list[LevelResult]], bool] | None = None) -> ProfileResult:
    """Profile as the options say; raises PerfError with a message for the user."""
    return Profiler(options, out, err, stop_when).run()


def _string_correlation_ids(batcher: dict[str, Any]) -> bool:
    """The model's CORRID control input takes strings: send string sequence ids."""
    for control_input in batcher.get("control_input", []) or []:
        for control in control_input.get("control", []) or []:
            if control.get("kind") == "CONTROL_SEQUENCE_CORRID" and control.get("data_type") == "TYPE_STRING":
                return True
    return False
