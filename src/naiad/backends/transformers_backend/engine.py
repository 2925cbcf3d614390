"""Continuous-batching engine: one asyncio task plans steps; torch runs them on one worker thread.

Every iteration drops cancelled sequences, admits waiting ones whose KV reservation fits the
budget (prefilled one by one), and runs ONE batched decode step for the sequences already
running: new requests join at every step, finished ones leave after it. Each sequence owns
its KV cache (per layer, [heads, capacity, head_dim]); a decode step gathers them left-padded
into a batch cache with an attention mask and explicit position ids, then appends the new
column back to each sequence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from naiad.backends.transformers_backend.sampling import SamplingParams, choose_token
from naiad.backends.transformers_backend.stats import EngineStats
from naiad.backends.transformers_backend.text import TextStream

log = logging.getLogger("naiad.backends.transformers")


class EngineError(Exception):
    """A request the engine can not take (too long for the model or the KV budget)."""


@dataclass
class SequenceOutput:
    """What one step produced for one sequence (delivered on the event loop)."""

    text: str
    finished: bool = False
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[SequenceOutput], None]
    is_cancelled: Callable[[], bool] = lambda: False
    text: TextStream | None = None
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    length: int = 0  # tokens held in kv
    reserved_tokens: int = 0
    arrival: float = field(default_factory=time.monotonic)
    last_token_at: float = 0.0
    finish_reason: str | None = None


class Engine:
    """Serves many sequences of one causal LM; `add` on the event loop, outputs via each sequence's emit."""

    def __init__(self, model: Any, tokenizer: Any, *, device: torch.device, kv_cache_bytes: int,
                 max_num_seqs: int, max_model_len: int, name: str = "llm") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.stats = EngineStats()
        self.stats.kv_budget_bytes = kv_cache_bytes
        self.bytes_per_token = _kv_bytes_per_token(model)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"naiad-llm-{name}")
        self._wake = asyncio.Event()
        self._closing = False
        self._failed: str | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"naiad-llm-{name}")

    # ------------------------------------------------------------ event-loop side

    def healthy(self) -> bool:
        return self._failed is None and not self._task.done()

    def tokenize(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; raises EngineError when it can never fit."""
        if self._failed is not None:
            raise EngineError(f"the engine stopped: {self._failed}")
        n = len(seq.prompt_ids)
        if n == 0:
            raise EngineError("the prompt is empty after tokenization")
        if n >= self.max_model_len:
            raise EngineError(f"the prompt has {n} tokens; this model takes at most {self.max_model_len - 1} "
                              "prompt tokens (max_model_len)")
        seq.reserved_tokens = min(n + seq.params.max_tokens, self.max_model_len)
        need = seq.reserved_tokens * self.bytes_per_token
        if need > self.stats.kv_budget_bytes:
            raise EngineError(f"the request needs {need} bytes of KV cache ({seq.reserved_tokens} tokens), more than "
                              f"kv_cache_bytes={self.stats.kv_budget_bytes}; lower max_tokens or raise the budget")
        p = seq.params
        seq.text = TextStream(self.tokenizer, p.stop, p.include_stop_str_in_output, p.skip_special_tokens)
        if p.seed is not None and not p.greedy:
            seq.generator = torch.Generator(device="cpu").manual_seed(p.seed)
        self.waiting.append(seq)
        self.stats.waiting = len(self.waiting)
        self._wake.set()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        try:
            await self._task
        except BaseException:  # already logged by _run
            pass
        for seq in list(self.running) + list(self.waiting):
            self._finish(seq, SequenceOutput("", True, "abort", error="the model is being unloaded"))
        self.running.clear()
        self.waiting.clear()
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            self._drop_cancelled()
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            decoding = list(self.running)
            try:
                events = await loop.run_in_executor(self._executor, self._step, admitted, decoding)
            except Exception as exc:  # a torch failure fails the sequences of this step, not the server
                log.exception("LLM engine step failed")
                for seq in admitted + decoding:
                    self._finish(seq, SequenceOutput("", True, "abort", error=f"generation failed: {exc}"))
                continue
            self.running.extend(admitted)
            self._deliver(events)

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.running if s.is_cancelled()]:
            self._release(seq, "cancelled")
        if any(s.is_cancelled() for s in self.waiting):
            gone = [s for s in self.waiting if s.is_cancelled()]
            self.waiting = deque(s for s in self.waiting if not s.is_cancelled())
            self.stats.finished["cancelled"] = self.stats.finished.get("cancelled", 0) + len(gone)
        self._update_gauges()

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        reserved = sum(s.reserved_tokens for s in self.running)
        budget_tokens = self.stats.kv_budget_bytes // self.bytes_per_token
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            if reserved + seq.reserved_tokens > budget_tokens:
                break  # FIFO: wait until running sequences free their reservation
            self.waiting.popleft()
            reserved += seq.reserved_tokens
            admitted.append(seq)
        self.stats.kv_reserved_bytes = reserved * self.bytes_per_token
        self.stats.waiting = len(self.waiting)
        return admitted

    def _deliver(self, events: list[tuple[Sequence, SequenceOutput]]) -> None:
        now = time.monotonic()
        produced = 0
        for seq, out in events:
            produced += 1
            if len(seq.generated) == 1:
                self.stats.ttft.observe(now - seq.arrival)
                self.stats.prompt_tokens += len(seq.prompt_ids)
            elif seq.last_token_at:
                self.stats.itl.observe(now - seq.last_token_at)
            seq.last_token_at = now
            if out.finished:
                self.stats.e2e.observe(now - seq.arrival)
                self._release(seq, out.finish_reason or "stop")
            seq.emit(out)
        self.stats.record_tokens(produced, now)
        self._update_gauges()

    def _release(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        seq.kv = []
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1

    def _finish(self, seq: Sequence, out: SequenceOutput) -> None:
        self._release(seq, out.finish_reason or "abort")
        seq.emit(out)

    def _update_gauges(self) -> None:
        s = self.stats
        s.running = len(self.running)
        s.waiting = len(self.waiting)
        s.kv_reserved_bytes = sum(q.reserved_tokens for q in self.running) * self.bytes_per_token
        s.kv_used_bytes = sum(q.length for q in self.running) * self.bytes_per_token

    # ------------------------------------------------------------ worker-thread side

    def _step(self, admitted: list[Sequence], decoding: list[Sequence]) -> list[tuple[Sequence, SequenceOutput]]:
        events: list[tuple[Sequence, SequenceOutput]] = []
        with torch.inference_mode():
            for seq in admitted:
                events.append((seq, self._prefill(seq)))
            if decoding:
                events.extend(self._decode(decoding))
        return events

    def _prefill(self, seq: Sequence) -> SequenceOutput:
        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
        n = len(seq.prompt_ids)
        capacity = min(seq.reserved_tokens, n + 64)
        seq.kv = []
        for layer in out.past_key_values.layers:
            keys, values = layer.keys[0], layer.values[0]
            k = keys.new_empty((keys.shape[0], capacity, keys.shape[2]))
            v = values.new_empty((values.shape[0], capacity, values.shape[2]))
            k[:, :n] = keys
            v[:, :n] = values
            seq.kv.append((k, v))
        seq.length = n
        return self._next_token(seq, out.logits[0, -1])

    def _decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, SequenceOutput]]:
        from transformers import DynamicCache

        longest = max(s.length for s in seqs)
        batch = len(seqs)
        cache = DynamicCache()
        for index in range(len(seqs[0].kv)):
            k0, v0 = seqs[0].kv[index]
            keys = k0.new_zeros((batch, k0.shape[0], longest, k0.shape[2]))
            values = v0.new_zeros((batch, v0.shape[0], longest, v0.shape[2]))
            for b, seq in enumerate(seqs):
                k, v = seq.kv[index]
                keys[b, :, longest - seq.length:] = k[:, :seq.length]
                values[b, :, longest - seq.length:] = v[:, :seq.length]
            cache.update(keys, values, index)
        mask = torch.zeros((batch, longest + 1), dtype=torch.long, device=self.device)
        for b, seq in enumerate(seqs):
            mask[b, longest - seq.length:] = 1
        inputs = torch.tensor([[s.generated[-1]] for s in seqs], dtype=torch.long, device=self.device)
        positions = torch.tensor([[s.length] for s in seqs], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inputs, past_key_values=cache, attention_mask=mask, position_ids=positions, use_cache=True)
        layers = out.past_key_values.layers
        events = []
        for b, seq in enumerate(seqs):
            self._append_kv(seq, [(layer.keys[b, :, -1], layer.values[b, :, -1]) for layer in layers])
            events.append((seq, self._next_token(seq, out.logits[b, -1])))
        self.stats.record_decode(batch)
        return events

    def _append_kv(self, seq: Sequence, columns: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        position = seq.length
        if position >= seq.kv[0][0].shape[1]:
            grow = min(seq.reserved_tokens, max(position * 2, position + 1))
            for index, (k, v) in enumerate(seq.kv):
                bigger_k = k.new_empty((k.shape[0], grow, k.shape[2]))
                bigger_v = v.new_empty((v.shape[0], grow, v.shape[2]))
                bigger_k[:, :position] = k[:, :position]
                bigger_v[:, :position] = v[:, :position]
                seq.kv[index] = (bigger_k, bigger_v)
        for (k, v), (new_k, new_v) in zip(seq.kv, columns):
            k[:, position] = new_k
            v[:, position] = new_v
        seq.length = position + 1

    def _next_token(self, seq: Sequence, logits: torch.Tensor) -> SequenceOutput:
        p = seq.params
        blocked = []
        if len(seq.generated) < p.min_tokens:
            blocked = [t for t in (*self.eos_ids, *p.stop_token_ids) if not (p.ignore_eos and t in self.eos_ids)]
        history = seq.prompt_ids + seq.generated if p.repetition_penalty != 1.0 else []
        token = choose_token(logits.float().clone(), p, history, seq.generated, seq.generator, blocked)
        seq.generated.append(token)
        assert seq.text is not None
        reason = None
        if token in self.eos_ids and not p.ignore_eos:
            reason = "stop"
        elif token in p.stop_token_ids:
            reason = "stop"
        else:
            seq.text.add(token)
            if seq.text.stopped:
                reason = "stop"
        if reason is None and (len(seq.generated) >= p.max_tokens or seq.length + 1 >= self.max_model_len):
            reason = "length"
        seq.finish_reason = reason
        return SequenceOutput(seq.text.take(reason is not None), reason is not None, reason,
                              len(seq.prompt_ids), len(seq.generated))


def _kv_bytes_per_token(model: Any) -> int:
    """Bytes of K and V one token takes across layers, measured with a one-token forward."""
    with torch.inference_mode():
        device = next(model.parameters()).device
        ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
    total = 0
    for layer in out.past_key_values.layers:
        total += layer.keys[0, :, 0].numel() * layer.keys.element_size()
        total += layer.values[0, :, 0].numel() * layer.values.element_size()
    return max(total, 1)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    vocab = getattr(model.config, "vocab_size", None)
    return {i for i in ids if vocab is None or i < vocab}
