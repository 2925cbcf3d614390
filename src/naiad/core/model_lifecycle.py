"""Model lifecycle: load, reload, unload, version routing, states and the repository index."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tritonclient.grpc import model_config_pb2 as mc

from naiad.backends.base import PoolInstance, ServerServices
from naiad.backends.registry import BackendRegistry
from naiad.config.ensemble import apply_decoupled_steps, composing_models
from naiad.config.model_config import ConfigError, ConfigReadError
from naiad.config.server_config import ServerConfig
from naiad.core.model_loader import (
    PreparedModel,
    instance_source,
    instance_specs,
    instances_memory_bytes,
    prepare_model,
)
from naiad.core.model_residency import ResidencyManager
from naiad.core.model_version import ModelVersion
from naiad.core.model_warmup import warm_up
from naiad.protocol.errors import ErrorCode, NaiadError, internal, invalid_arg, not_found
from naiad.protocol.model_names import check_model_name
from naiad.protocol.model_versions import parse_model_version
from naiad.repository.catalog import ModelLocation, RepositoryCatalog
from naiad.repository.local import version_directories
from naiad.runtime.memory import release_free_memory, rss_bytes
from naiad.runtime.placement import start_instance
from naiad.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("naiad.lifecycle")

# Names of the ensembles being loaded by the current task chain (cycle detection).
_LOADING: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("naiad_loading", default=frozenset())

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass
class VersionState:
    state: str
    reason: str = ""
    model: ModelVersion | None = None


@dataclass
class ModelRecord:
    """What the server knows of one model name."""

    name: str
    versions: dict[int, VersionState] = field(default_factory=dict)
    fingerprint: tuple[object, ...] | None = None
    config_override: str | None = None
    override_dir: Path | None = None
    dependency_of: set[str] = field(default_factory=set)  # ensembles that loaded this model for themselves
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def ready(self) -> dict[int, ModelVersion]:
        return {v: s.model for v, s in self.versions.items() if s.state == READY and s.model is not None}

    def healthy(self) -> bool:
        return all(m.healthy() for m in self.ready().values())


def _directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
    return total


def _write_override_files(name: str, files: dict[str, bytes]) -> Path:
    """Materialise `file:<version>/<path>` overrides in a temporary model directory, refusing traversal."""
    root = Path(tempfile.mkdtemp(prefix="naiad-override-"))
    model_dir = root / name
    model_dir.mkdir()
    for key, content in files.items():
        relative = key[5:] if key.startswith("file:") else key
        parts = PurePosixPath(relative).parts
        if not parts or relative.startswith("/") or any(p in ("..", "") for p in parts) or "\\" in relative:
            shutil.rmtree(root, ignore_errors=True)
            raise invalid_arg(f"invalid file override path '{key}' for model '{name}'")
        target = model_dir.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return model_dir


_ERROR_CODE_NAMES = ("Unknown: ", "Internal: ", "Not found: ", "Invalid argument: ", "Unavailable: ", "Unsupported: ",
                     "Already exists: ", "Cancelled: ")


def _reason(exc: BaseException) -> str:
    """A version's UNAVAILABLE reason; as in Triton, a config problem's starts with its error code's name."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ConfigError) and not text.startswith(_ERROR_CODE_NAMES):
        return f"Invalid argument: {text}"
    return text


class ModelLifecycle:
    """All model records of one server; loads run on a bounded thread pool, routing on the loop."""

    def __init__(
        self, settings: ServerConfig, backends: BackendRegistry, services: ServerServices | None = None,
        rate_limiter: RateLimiter | None = None, summary_quantiles: tuple[tuple[float, float], ...] | None = None,
    ) -> None:
        self.settings = settings
        self.rate_limiter = rate_limiter
        self.summary_quantiles = summary_quantiles  # --metrics-config summary_quantiles, for each version's statistics
        self.backends = backends
        self.services = services
        self.catalog = RepositoryCatalog(settings.model_repositories)
        pinned = {n for n in settings.load_models if n != "*"}
        self.residency = ResidencyManager(settings.model_memory_budget, settings.model_idle_unload_secs, pinned, self._evict)
        self._measure_lock = asyncio.Lock()  # loads are measured one at a time when a budget is set
        self.records: dict[str, ModelRecord] = {}
        # Models whose config could not be read at their last load: not indexed (as Triton), but reported at start-up.
        self.unreadable: dict[str, str] = {}
        self._executor = ThreadPoolExecutor(max_workers=max(settings.model_load_thread_count, 1), thread_name_prefix="naiad-load")

    # ------------------------------------------------------------ lookups

    def scan(self) -> tuple[dict[str, ModelLocation], dict[str, list[str]]]:
        return self.catalog.scan()

    def lookup(self, name: str, version: str = "") -> ModelVersion:
        """The version serving a request: the given one, else the highest READY one."""
        # like Triton, a bad version string fails before the name; "" (the usual request) needs no parsing
        number = parse_model_version(version) if version else None
        record = self.records.get(name)
        if record is None or not record.versions:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if number is not None:
            state = record.versions.get(number)
            if state is None or state.state != READY or state.model is None:
                raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
            return state.model
        best: tuple[int, ModelVersion] | None = None  # the highest READY version, without a dict per request
        for candidate, state in record.versions.items():
            if state.state == READY and state.model is not None and (best is None or candidate > best[0]):
                best = (candidate, state.model)
        if best is None:
            raise not_found(f"Request for unknown model: '{name}' has no available versions")
        return best[1]

    def version_known(self, name: str, version: str) -> VersionState | None:
        record = self.records.get(name)
        if record is None or not version.isdigit():
            return None
        return record.versions.get(int(version))

    def all_ready(self) -> bool:
        for record in self.records.values():
            if not record.healthy():
                return False
            for state in record.versions.values():
                if state.state == READY:
                    continue
                if state.state == UNAVAILABLE and state.reason.startswith("unloaded"):
                    continue
                return False
        return True

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        locations, duplicates = self.scan()
        names = sorted(set(locations) | set(duplicates) | set(self.records))
        entries: list[dict[str, str]] = []
        for name in names:
            record = self.records.get(name)
            if record is None or not record.versions:
                if not ready_only:
                    entries.append({"name": name})
                continue
            for version, state in sorted(record.versions.items()):
                if ready_only and state.state != READY:
                    continue
                entry = {"name": name, "version": str(version), "state": state.state}
                if state.reason:
                    entry["reason"] = state.reason
                entries.append(entry)
        return entries

    # ------------------------------------------------------------ load / unload

    async def load_all(self, names: list[str] | None = None) -> list[str]:
        """Load models in parallel (bounded by the loader pool); returns the failure messages."""
        locations, duplicates = self.scan()
        for name, dirs in duplicates.items():
            record = self.records.setdefault(name, ModelRecord(name))
            reason = f"model '{name}' appears in more than one model repository: {dirs}"
            record.versions = {1: VersionState(UNAVAILABLE, reason)}
            log.error(reason)
        wanted = sorted(locations) if names is None else names
        done = failed = 0
        step = max(len(wanted) // 10, 1)

        async def load_one(name: str) -> None:
            nonlocal done, failed
            try:
                await self.load(name)
            except BaseException:
                failed += 1
                raise
            finally:
                done += 1
                if done % step == 0 or done == len(wanted):
                    # loaded and failed apart: "loaded 5/5" must not hide that two of them failed
                    log.info("loaded %d/%d models%s%s", done - failed, len(wanted),
                             f", {failed} failed" if failed else "",
                             f", {len(wanted) - done} loading" if done < len(wanted) else "")

        results = await asyncio.gather(*(load_one(n) for n in wanted), return_exceptions=True)
        failures = []
        for result in results:
            if isinstance(result, BaseException):
                failures.append(result.message if isinstance(result, NaiadError) else str(result))
        return failures

    async def load(self, name: str, config_override: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load or reload `name`; on failure previously READY versions keep serving."""
        check_model_name(name)
        if files and config_override is None:
            raise invalid_arg(f"failed to load '{name}': the 'config' parameter is required when 'file:' overrides are given")
        record = self.records.setdefault(name, ModelRecord(name))
        async with record.lock:
            if self.residency.budget_bytes is not None:
                async with self._measure_lock:
                    await self._load_locked(record, config_override, files)
            else:
                await self._load_locked(record, config_override, files)
        if self.residency.active:
            await self.residency.enforce(keep=name)

    async def _load_locked(self, record: ModelRecord, config_override: str | None, files: dict[str, bytes] | None) -> None:
        name = record.name
        loop = asyncio.get_running_loop()
        if files:
            model_dir = _write_override_files(name, files)
            fingerprint: tuple[object, ...] | None = None
        else:
            locations, duplicates = self.scan()
            if name in duplicates:
                raise invalid_arg(f"failed to load '{name}': model appears in more than one model repository")
            location = locations.get(name)
            if location is None:
                if not record.versions:
                    self.records.pop(name, None)
                raise internal(f"failed to load '{name}', failed to poll from model repository")
            fingerprint = await loop.run_in_executor(self._executor, location.repository.fingerprint, name)
            unchanged = record.fingerprint == fingerprint and record.ready() and record.override_dir is None
            if unchanged and config_override is None:
                return  # nothing changed: Triton treats this load as a no-op
            try:
                model_dir = await loop.run_in_executor(self._executor, location.repository.local_path, name)
            except OSError as exc:
                reason = f"unable to fetch model '{name}' from '{location.repository.root}': {exc}"
                log.error("%s", reason)
                attempted: list[tuple[int, VersionState | None]] = [*record.versions.items()] or [(1, None)]
                for version, state in attempted:
                    if state is None or state.state != READY:
                        record.versions[version] = VersionState(UNAVAILABLE, reason)
                raise self._load_error(record, {version: reason for version, _ in attempted}) from None
        if config_override is None and not files and record.override_dir is None:
            config_override = record.config_override  # an override stays in force across reloads
        before = dict(record.versions)
        for version in version_directories(model_dir) or [1]:
            current = record.versions.get(version)
            if current is None or current.state != READY:
                record.versions[version] = VersionState(LOADING)
        try:
            prepared: PreparedModel = await loop.run_in_executor(
                self._executor, prepare_model, name, model_dir, self.settings, self.backends, config_override
            )
        except ConfigReadError as exc:
            # Triton's repository poll fails: no version state changes, so the index and readiness are as before.
            record.versions = before
            if not record.versions:
                self.records.pop(name, None)
            if files:
                shutil.rmtree(model_dir.parent, ignore_errors=True)
            log.error("failed to load '%s': %s", name, exc)
            self.unreadable[name] = str(exc)
            raise internal(f"failed to load '{name}', failed to poll from model repository: {exc}") from None
        except Exception as exc:  # a config problem, or a backend's own error: the model is UNAVAILABLE, never stuck LOADING
            self.unreadable.pop(name, None)
            message = _reason(exc) if isinstance(exc, (ConfigError, OSError, ValueError)) else f"{type(exc).__name__}: {exc}"
            raise self._load_error(record, self._mark_failed(record, model_dir, message)) from None
        self.unreadable.pop(name, None)
        if prepared.config.platform == "ensemble":
            try:
                await self._load_dependencies(prepared.config)
            except NaiadError as exc:
                raise self._load_error(record, self._mark_failed(record, model_dir, exc.message)) from None
        new_versions: dict[int, ModelVersion] = {}
        failed: dict[int, str] = {v: f"version {v} is not present in the model directory" for v in prepared.missing_versions}
        for version in sorted(prepared.versions):
            try:
                started, rss_before = time.monotonic(), rss_bytes()
                instances = [] if prepared.config.platform == "ensemble" else await self._create_instances(prepared, version)
                model = ModelVersion(
                    prepared.config, version, model_dir, instances, self.services, self.rate_limiter, self.summary_quantiles
                )
                if prepared.config.model_warmup:
                    try:
                        await warm_up(model, model_dir)
                    except ConfigError:
                        await model.close()
                        raise
                model.stats.load_duration_secs = time.monotonic() - started
                # Measured: what this process grew by, plus worker processes' own memory. Freed memory
                # of evicted models is reused without RSS growing, so the version's files (weights are
                # resident once loaded) are the floor of the measurement.
                measured = max(rss_bytes() - rss_before, 0) + instances_memory_bytes(instances)
                model.memory_bytes = max(measured, _directory_bytes(prepared.versions[version]))
                new_versions[version] = model
            except Exception as exc:  # any backend failure makes this version UNAVAILABLE with its reason
                failed[version] = _reason(exc)
                log.error("failed to load '%s' version %d: %s", name, version, failed[version])
        old = {v: s.model for v, s in record.versions.items() if s.model is not None}
        # Switch routing: new versions become READY; versions no longer served are drained and closed.
        states: dict[int, VersionState] = {}
        for version, model in new_versions.items():
            states[version] = VersionState(READY, "", model)
            log.info("successfully loaded '%s' version %d", name, version)
        for version, reason in failed.items():
            previous = record.versions.get(version)
            if previous is not None and previous.model is not None and previous.state == READY and version not in new_versions:
                states[version] = previous  # a failed reload keeps the old version serving
                old.pop(version, None)
            else:
                states[version] = VersionState(UNAVAILABLE, reason)
        for version, previous in record.versions.items():
            if version not in states and previous.model is not None:
                states[version] = VersionState(UNAVAILABLE, "unloaded")
        record.versions = states
        for retired in old.values():
            retired.retired = True  # handles resolved on it are looked up again (ResolvedModel)
        record.fingerprint = fingerprint
        record.config_override = config_override
        if record.override_dir is not None and record.override_dir != model_dir and files:
            shutil.rmtree(record.override_dir.parent, ignore_errors=True)
        record.override_dir = model_dir if files else None
        await asyncio.gather(*(self._retire(m) for m in old.values()))
        if old:
            release_free_memory()
        if record.ready():
            ready = record.ready().values()
            workers = tuple(i for m in ready for i in m.pool.instances if i.in_worker_process)
            self.residency.loaded(name, sum(m.memory_bytes for m in ready), workers)
        if failed:
            raise self._load_error(record, failed)

    async def _load_dependencies(self, config: mc.ModelConfig) -> None:
        """An ensemble loads (or waits for) its composing models and checks their tensor names."""
        chain = _LOADING.get()
        if config.name in chain:
            raise invalid_arg(f"circular dependency: ensemble '{config.name}' includes itself through {sorted(chain)}")
        token = _LOADING.set(chain | {config.name})
        try:
            for dependency in composing_models(config):
                if dependency in chain or dependency == config.name:
                    raise invalid_arg(f"circular dependency between ensemble '{config.name}' and '{dependency}'")
                record = self.records.get(dependency)
                if record is None or not record.ready():
                    try:
                        await self.load(dependency)
                    except NaiadError as exc:
                        raise invalid_arg(f"composing model '{dependency}' of ensemble '{config.name}' failed to load: {exc.message.strip()}") from None
                    self.records[dependency].dependency_of.add(config.name)
        finally:
            _LOADING.reset(token)
        decoupled_steps: set[int] = set()
        for index, step in enumerate(config.ensemble_scheduling.step):
            version = str(step.model_version) if step.model_version >= 0 else ""
            try:
                model = self.lookup(step.model_name, version)
            except NaiadError as exc:
                raise invalid_arg(f"ensemble '{config.name}' step {index}: {exc.message}") from None
            if model.decoupled:
                decoupled_steps.add(index)
            for key in step.input_map:
                if key not in model.inputs:
                    raise invalid_arg(f"ensemble '{config.name}' step {index}: '{key}' is not an input of model '{model.name}'")
            for key in step.output_map:
                if key not in model.outputs:
                    raise invalid_arg(f"ensemble '{config.name}' step {index}: '{key}' is not an output of model '{model.name}'")
        try:
            apply_decoupled_steps(config, decoupled_steps)
        except ConfigError as exc:
            raise invalid_arg(str(exc)) from None

    async def _create_instances(self, prepared: PreparedModel, version: int) -> list[PoolInstance]:
        """Create every instance of a version in parallel; on any failure close those already made."""
        backend, source = instance_source(prepared, version, self.settings, self.backends, self.services)
        specs = instance_specs(prepared.config)
        results = await asyncio.gather(*(start_instance(backend, source, s, self._executor) for s in specs),
                                       return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for instance in made:
                await instance.aclose()
            raise errors[0]
        return made

    def _mark_failed(self, record: ModelRecord, model_dir: Path, reason: str) -> dict[int, str]:
        """Versions that were loading become UNAVAILABLE (READY ones keep serving); {version: reason}."""
        log.error("failed to load '%s': %s", record.name, reason)
        versions = version_directories(model_dir) or {1: model_dir}
        for version in versions:
            previous = record.versions.get(version)
            if previous is not None and previous.state == READY and previous.model is not None:
                continue
            record.versions[version] = VersionState(UNAVAILABLE, reason)
        for version, state in record.versions.items():
            if state.state == LOADING:
                record.versions[version] = VersionState(UNAVAILABLE, reason)
        return {version: reason for version in versions}

    def _load_error(self, record: ModelRecord, failed: dict[int, str] | None = None) -> NaiadError:
        """Triton's text: one line per version that failed, even when an older copy of it keeps serving."""
        lines = []
        for version, state in sorted(record.versions.items()):
            if failed is not None and version not in failed:
                continue
            if state.state == UNAVAILABLE or failed is not None:
                reason = failed[version] if failed is not None else state.reason
                lines.append(f"version {version} is at UNAVAILABLE state: {reason};\n")
        return NaiadError(ErrorCode.INVALID_ARG, f"load failed for model '{record.name}': " + "".join(lines))

    async def _retire(self, model: ModelVersion) -> None:
        """Let in-flight requests of a replaced/unloaded version finish, then free it."""
        while model.scheduler.inflight() > 0:
            await asyncio.sleep(0.005)
        await model.close()

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload; with unload_dependents also the composing models loaded only for this ensemble."""
        check_model_name(name)
        record = self.records.get(name)
        if record is None:
            return
        dependencies = [
            r.name for r in self.records.values() if name in r.dependency_of
        ] if unload_dependents else []
        await self._unload_one(record)
        for dependency in dependencies:
            dep = self.records[dependency]
            dep.dependency_of.discard(name)
            if not dep.dependency_of:
                await self.unload(dependency, unload_dependents=True)

    async def _evict(self, name: str, reason: str) -> None:
        record = self.records.get(name)
        if record is not None:
            await self._unload_one(record, reason)

    async def _unload_one(self, record: ModelRecord, reason: str = "unloaded") -> None:
        name = record.name
        async with record.lock:
            serving = {v: s for v, s in record.versions.items() if s.model is not None}
            for state in serving.values():
                state.state = UNLOADING
                if state.model is not None:
                    state.model.retired = True
            await asyncio.gather(*(self._retire(s.model) for s in serving.values() if s.model is not None))
            for version in record.versions:
                record.versions[version] = VersionState(UNAVAILABLE, reason)
            self.residency.unloaded(name)
            release_free_memory()
            record.fingerprint = None
            record.config_override = None
            if record.override_dir is not None:
                shutil.rmtree(record.override_dir.parent, ignore_errors=True)
                record.override_dir = None
            log.info("successfully unloaded '%s'", name)

    async def poll_once(self) -> None:
        """POLL mode: load new models, reload changed ones, unload removed ones; failures keep old versions."""
        locations, _ = self.scan()
        for name in [n for n, r in self.records.items() if n not in locations and r.ready()]:
            await self.unload(name)
        loop = asyncio.get_running_loop()
        for name in sorted(locations):
            record = self.records.get(name)
            fingerprint = await loop.run_in_executor(self._executor, locations[name].repository.fingerprint, name)
            if record is not None and record.fingerprint == fingerprint:
                continue
            try:
                await self.load(name)
            except NaiadError as exc:
                log.error("%s", exc.message.rstrip())

    async def unload_all(self) -> None:
        """At shutdown: every model, then the local copies of remote repositories."""
        await self.residency.stop()
        try:
            await asyncio.gather(*(self.unload(n) for n in list(self.records)), return_exceptions=True)
        finally:
            self.catalog.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
