"""Batched token selection on the device: penalties, greedy / temperature / top-k / top-p / min-p,
per-request seeded generators, and top-k logprobs.

Rows are independent: a row's result depends only on its logits, its parameters and its own
generator, never on which other requests share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from railyard.engine.config import SamplingParams


@dataclass
class SamplingRow:
    """One sequence to sample for this step."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    suppress_ids: list[int]  # token ids forbidden this step (EOS / stop ids before min_tokens)
    generator: torch.Generator | None


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]  # sampled token + top-k alternatives, when asked


class PendingSample:
    """A step's sampled tokens while they may still be on their way from the device.

    `token_ids` stays on the device (the next step reads it there to feed its decode inputs); the host copies
    start at once, non-blocking into pinned memory, and `result()` waits only for them, not for later work
    queued on the stream. On the CPU everything is already done.
    """

    def __init__(self, token_ids: torch.Tensor, logprob_tensors: tuple[torch.Tensor, ...] | None,
                 want_logprobs: list[int | None]) -> None:
        self.token_ids = token_ids
        self._want = want_logprobs
        self._event = None
        tensors = (token_ids,) + (logprob_tensors or ())
        if token_ids.is_cuda:
            self._host = tuple(_pinned_copy(t) for t in tensors)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tensors
        self._with_logprobs = logprob_tensors is not None
        self._result: SamplerOutput | None = None

    def result(self) -> SamplerOutput:
        if self._result is None:
            if self._event is not None:
                self._event.synchronize()
            self._result = _to_output(self._host, self._with_logprobs, self._want)
        return self._result


class DoneSample:
    """A step's result that is already on the host (tensor-parallel executors, empty steps)."""

    token_ids = None

    def __init__(self, output: SamplerOutput) -> None:
        self._output = output

    def result(self) -> SamplerOutput:
        return self._output


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _to_output(host: tuple[torch.Tensor, ...], with_logprobs: bool, want: list[int | None]) -> SamplerOutput:
    token_ids = host[0].tolist()
    logprobs: list[dict[int, float] | None] = [None] * len(token_ids)
    if with_logprobs:
        top_vals, top_ids, picked = (t.tolist() for t in host[1:])
        for i, n in enumerate(want):
            if n is None:
                continue
            entry = {token_ids[i]: picked[i]}
            for tid, val in zip(top_ids[i][:n], top_vals[i][:n]):
                entry.setdefault(tid, val)
            logprobs[i] = entry
    return SamplerOutput(token_ids, logprobs)


def host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a device tensor without a stream sync (see to_device)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on the device without a stream sync: a plain copy (torch.tensor(..., device=cuda) too)
    waits for the GPU to drain, which would stop the host from running ahead of it."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    dev = logits.device
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=dev)
            ids = torch.tensor(row.prompt_ids + row.output_ids, dtype=torch.long, device=dev)
            seen[ids[ids < vocab]] = True
            x = logits[i]
            logits[i] = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
        if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
            ids = torch.tensor(row.output_ids, dtype=torch.long, device=dev)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k / top-p / min-p set to -inf."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    cum = probs.cumsum(dim=-1)
    drop |= (cum - probs) > top_p[:, None]  # keep the smallest prefix whose mass reaches top_p
    drop |= probs < (min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@torch.inference_mode()
def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
    """Pick one token per row of float32 logits [B, V] (waits for the result)."""
    return sample_async(logits, rows).result()


@torch.inference_mode()
def sample_async(logits: torch.Tensor, rows: list[SamplingRow]) -> PendingSample:
    """Queue the sampling of one token per row of logits [B, V]; no host synchronisation."""
    if all(r.params.greedy and r.params.logprobs is None and not r.suppress_ids
           and not r.params.needs_output_history for r in rows):
        # Plain greedy: argmax of the model-dtype logits is argmax of their exact float32 values.
        return PendingSample(logits.argmax(dim=-1), None, [None] * len(rows))
    logits = logits.float()
    dev = logits.device
    want_logprobs = [r.params.logprobs for r in rows]
    raw_logprobs = logits.log_softmax(dim=-1) if any(n is not None for n in want_logprobs) else None
    for i, row in enumerate(rows):
        if row.suppress_ids:
            logits[i, host_tensor(row.suppress_ids, torch.long, dev)] = float("-inf")
    if any(r.params.repetition_penalty != 1.0 or r.params.presence_penalty or r.params.frequency_penalty
           for r in rows):
        _apply_penalties(logits, rows)

    chosen = logits.argmax(dim=-1)
    if not all(r.params.greedy for r in rows):  # decided on the host: no device sync before sampling
        greedy = host_tensor([r.params.greedy for r in rows], torch.bool, dev)
        temps = host_tensor([max(r.params.temperature, 1e-5) for r in rows], torch.float32, dev)
        scaled = logits / temps[:, None]
        if any(r.params.top_k or r.params.top_p < 1.0 or r.params.min_p > 0.0 for r in rows):
            scaled = _filter(scaled,
                             host_tensor([r.params.top_k for r in rows], torch.long, dev),
                             host_tensor([r.params.top_p for r in rows], torch.float32, dev),
                             host_tensor([r.params.min_p for r in rows], torch.float32, dev))
        probs = scaled.softmax(dim=-1)
        noise = torch.empty_like(probs)
        for i, row in enumerate(rows):
            if not row.params.greedy:
                noise[i].exponential_(generator=row.generator)
        # Gumbel-max in exponential form: argmax p/E with E ~ Exp(1) samples from p.
        sampled = (probs / noise.clamp_min(1e-10)).argmax(dim=-1)
        chosen = torch.where(greedy, chosen, sampled)

    logprob_tensors = None
    if raw_logprobs is not None:
        k_max = max(n or 0 for n in want_logprobs)
        top_vals, top_ids = raw_logprobs.topk(max(k_max, 1), dim=-1)
        picked = raw_logprobs.gather(1, chosen[:, None]).squeeze(1)
        logprob_tensors = (top_vals, top_ids, picked)
    return PendingSample(chosen, logprob_tensors, want_logprobs)
