"""Continuous-batching engine: one asyncio task plans steps; torch runs them on one worker thread.

Every iteration drops cancelled sequences, admits waiting ones whose KV reservation fits the
budget, prefills the admitted prompts together (right-padded, at most `max_num_batched_tokens`
padded tokens per step) and runs ONE batched decode step for the sequences already running:
new requests join at every step, finished ones leave after it. The running batch's KV cache
lives in per-layer buffers written in place (kvcache.BatchKV); a decode step attends over them
with a padding mask and per-sequence position ids.
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

from naiad.backends.transformers_backend.contract import SequenceOutput
from naiad.backends.transformers_backend.kvcache import BatchKV
from naiad.backends.transformers_backend.sampling import SamplingParams, choose_token
from naiad.backends.transformers_backend.stats import EngineStats
from naiad.backends.transformers_backend.text import TextStream

log = logging.getLogger("naiad.backends.transformers")


class EngineError(Exception):
    """A request the engine can not take (too long for the model or the KV budget)."""


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[SequenceOutput], None]
    is_cancelled: Callable[[], bool] = lambda: False
    text: TextStream | None = None
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    reserved_tokens: int = 0
    max_new_tokens: int = 0  # params.max_tokens, or what the reservation leaves when that is None
    arrival: float = field(default_factory=time.monotonic)
    last_token_at: float = 0.0
    finish_reason: str | None = None


class Engine:
    """Serves many sequences of one causal LM; `add` on the event loop, outputs via each sequence's emit."""

    def __init__(self, model: Any, tokenizer: Any, *, device: torch.device, kv_cache_bytes: int,
                 max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int = 2048,
                 name: str = "llm", bytes_per_token: int | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv = BatchKV()  # row i belongs to running[i]
        self.stats = EngineStats()
        self.stats.kv_budget_bytes = kv_cache_bytes
        self.bytes_per_token = bytes_per_token or kv_bytes_per_token(model)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.vocab_size = model.get_input_embeddings().num_embeddings
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
        if seq.params.max_tokens is None:
            # Until EOS or the context limit; the KV reservation (the whole budget at most) bounds it too.
            seq.reserved_tokens = min(self.max_model_len, self.stats.kv_budget_bytes // self.bytes_per_token)
            seq.max_new_tokens = seq.reserved_tokens - n
        else:
            seq.reserved_tokens = min(n + seq.params.max_tokens, self.max_model_len)
            seq.max_new_tokens = seq.params.max_tokens
        if bad := [t for t in seq.prompt_ids if not 0 <= t < self.vocab_size]:
            raise EngineError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        if seq.max_new_tokens < 1:
            raise EngineError(f"the prompt's {n} tokens leave no room in the KV cache budget "
                              f"(kv_cache_bytes={self.stats.kv_budget_bytes}); raise the budget")
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
        try:
            await self._loop()
        except Exception as exc:  # a bug here must not leave clients waiting forever
            log.exception("LLM engine stopped")
            self._failed = str(exc) or type(exc).__name__
            failed = list(self.running) + list(self.waiting)
            self.running.clear()
            self.waiting.clear()
            self.kv = BatchKV()
            for seq in failed:
                self._finish(seq, SequenceOutput("", True, "abort", error=f"the engine stopped: {self._failed}"))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            self._drop_cancelled()
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            if admitted:
                # Prefill first and hand out the first tokens before decoding: a new request's time to
                # first token does not include this step's decode.
                rows = len(self.running)
                events = await self._in_worker(loop, self._prefill, admitted, admitted)
                if events is None:
                    self.kv.truncate(rows)
                    continue
                self.running.extend(admitted)
                self._deliver(events)
            if self.running:
                decoding = list(self.running)  # rows 0..n-1, including those just prefilled
                events = await self._in_worker(loop, self._decode, decoding, decoding)
                if events is None:
                    self.running.clear()
                    self.kv = BatchKV()  # rows may be half-written: start the batch afresh
                    continue
                self._deliver(events)

    async def _in_worker(self, loop: asyncio.AbstractEventLoop, work: Callable[[list[Sequence]], Any],
                         seqs: list[Sequence], fail: list[Sequence]) -> list[tuple[Sequence, SequenceOutput]] | None:
        """Run one torch step on the worker thread; a failure fails `fail` (not the server) and returns None."""
        def run() -> list[tuple[Sequence, SequenceOutput]]:
            with torch.inference_mode():
                return work(seqs)
        try:
            return await loop.run_in_executor(self._executor, run)
        except Exception as exc:
            log.exception("LLM engine step failed")
            for seq in fail:
                if seq in self.running:
                    self.running.remove(seq)
                self._finish(seq, SequenceOutput("", True, "abort", error=f"generation failed: {exc}"))
            return None

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.running if s.is_cancelled()]:
            self._release(seq, "cancelled")
        if any(s.is_cancelled() for s in self.waiting):
            gone = [s for s in self.waiting if s.is_cancelled()]
            self.waiting = deque(s for s in self.waiting if not s.is_cancelled())
            self.stats.finished["cancelled"] = self.stats.finished.get("cancelled", 0) + len(gone)
        self._update_gauges()

    def _admit(self) -> list[Sequence]:
        """FIFO admission while the padded KV reservation (rows x longest reservation) fits the budget and
        this step's prefill stays within max_num_batched_tokens padded tokens (one prompt always fits)."""
        admitted: list[Sequence] = []
        budget_tokens = self.stats.kv_budget_bytes // self.bytes_per_token
        longest_res = max((s.reserved_tokens for s in self.running), default=0)
        longest_prompt = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            rows = len(self.running) + len(admitted) + 1
            if rows * max(longest_res, seq.reserved_tokens) > budget_tokens:
                break  # FIFO: wait until running sequences free their reservation
            prompt = max(longest_prompt, len(seq.prompt_ids))
            if admitted and prompt * (len(admitted) + 1) > self.max_num_batched_tokens:
                break  # the rest prefill in the next step
            self.waiting.popleft()
            longest_res = max(longest_res, seq.reserved_tokens)
            longest_prompt = prompt
            admitted.append(seq)
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
            row = self.running.index(seq)
            self.kv.remove(row)  # the last row moves into `row`: mirror it in `running`
            last = self.running.pop()
            if last is not seq:
                self.running[row] = last
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1

    def _finish(self, seq: Sequence, out: SequenceOutput) -> None:
        self._release(seq, out.finish_reason or "abort")
        seq.emit(out)

    def _update_gauges(self) -> None:
        s = self.stats
        s.running = len(self.running)
        s.waiting = len(self.waiting)
        longest = max((q.reserved_tokens for q in self.running), default=0)
        s.kv_reserved_bytes = len(self.running) * longest * self.bytes_per_token
        s.kv_used_bytes = sum(self.kv.lengths) * self.bytes_per_token

    # ------------------------------------------------------------ worker-thread side

    def _prefill(self, seqs: list[Sequence]) -> list[tuple[Sequence, SequenceOutput]]:
        """All admitted prompts in one forward, right-padded (a causal model never looks right, so padding
        needs no mask for the real tokens); each row's KV joins the batch buffers."""
        lengths = [len(s.prompt_ids) for s in seqs]
        longest = max(lengths)
        ids = torch.zeros((len(seqs), longest), dtype=torch.long)
        mask = torch.zeros((len(seqs), longest), dtype=torch.long)
        for b, seq in enumerate(seqs):
            ids[b, :lengths[b]] = torch.tensor(seq.prompt_ids, dtype=torch.long)
            mask[b, :lengths[b]] = 1
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=True)
        self.stats.record_prefill(len(seqs))
        layers = out.past_key_values.layers
        last = out.logits[torch.arange(len(seqs)), torch.tensor(lengths) - 1]
        for b in range(len(seqs)):
            self.kv.add([(layer.keys[b], layer.values[b]) for layer in layers], lengths[b], self.max_model_len)
        return self._next_tokens(seqs, last, lengths)

    def _decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, SequenceOutput]]:
        batch = len(seqs)
        cache, mask, positions = self.kv.decode_cache(batch, self.max_model_len)
        inputs = torch.tensor([[s.generated[-1]] for s in seqs], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inputs, past_key_values=cache, attention_mask=mask, position_ids=positions,
                         use_cache=True)
        self.kv.advance(batch)
        self.stats.record_decode(batch)
        return self._next_tokens(seqs, out.logits[:, -1], self.kv.lengths[:batch])

    def _next_tokens(self, seqs: list[Sequence], logits: torch.Tensor, lengths: list[int]
                     ) -> list[tuple[Sequence, SequenceOutput]]:
        """One token per row of logits [batch, vocab]: plain greedy rows share one argmax."""
        plain = [b for b, s in enumerate(seqs) if s.params.greedy and _plain(s)]
        tokens: dict[int, int] = {}
        if plain:
            picked = torch.argmax(logits[plain], dim=-1).tolist()
            tokens = dict(zip(plain, picked))
        events = []
        for b, seq in enumerate(seqs):
            token = tokens.get(b)
            if token is None:
                token = self._choose(seq, logits[b])
            events.append((seq, self._accept(seq, token, lengths[b])))
        return events

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> int:
        p = seq.params
        blocked = []
        if len(seq.generated) < p.min_tokens:
            blocked = [t for t in (*self.eos_ids, *p.stop_token_ids) if not (p.ignore_eos and t in self.eos_ids)]
        history = seq.prompt_ids + seq.generated if p.repetition_penalty != 1.0 else []
        return choose_token(logits.float().clone(), p, history, seq.generated, seq.generator, blocked)

    def _accept(self, seq: Sequence, token: int, length: int) -> SequenceOutput:
        """Record the token; `length` is the tokens already in the KV cache (the new one is not)."""
        p = seq.params
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
        if reason is None and (len(seq.generated) >= seq.max_new_tokens or length + 1 >= self.max_model_len):
            reason = "length"
        if reason is not None and not seq.text.stopped:
            seq.text.flush()  # bytes of a character the generation ended inside of: U+FFFD, as decode() gives
        seq.finish_reason = reason
        return SequenceOutput(seq.text.take(reason is not None), reason is not None, reason,
                              len(seq.prompt_ids), len(seq.generated))


def _plain(seq: Sequence) -> bool:
    """No penalty or blocked token changes this sequence's logits."""
    p = seq.params
    return (p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
            and len(seq.generated) >= p.min_tokens)


def kv_bytes_per_token(model: Any) -> int:
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
