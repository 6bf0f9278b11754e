"""How far a quantized engine (FP8 weights, an FP8 KV cache) drifts from the unquantized one on the same weights.

`compare_prefill` runs one prefill step of the same prompts through a reference model runner and a
candidate one and compares, position by position: each decoder layer's output (the residual stream
after the layer, cosine similarity per token), the final logits (KL divergence of the candidate's
distribution from the reference's, in nats) and their argmax (teacher-forced top-1 agreement). The
prefill writes its keys and values into the paged cache and attends over them there, so a
quantized cache is measured too. With a LoRA adapter, every runner built with enable_lora runs each prompt under it
(an FP8 model's adapters against the unquantized model's; a runner without LoRA is then the model the adapter
left alone). `greedy_agreement` compares free-running greedy generations, where one
early flip changes everything after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from railyard.engine.config import EngineConfig
from railyard.engine.lora.request import LoRARequest
from railyard.engine.runner.layers.fp8 import ScaledAccumulator
from railyard.engine.runner.model_runner import ModelRunner, StepPlan
from railyard.engine.runner.models.checkpoint_dir import resolve_model_dir
from railyard.model.spec import ModelSpec, read_model_spec


@dataclass
class PrefillOutputs:
    """One prefill of some prompts: every decoder layer's output [T, hidden] and the logits [T, vocab]."""

    layers: list[torch.Tensor]
    logits: torch.Tensor


@dataclass
class Comparison:
    """A candidate's prefill against the reference's, over the same T positions."""

    layer_cosine: list[float]  # per decoder layer: mean over tokens of cos(reference, candidate)
    min_token_cosine: float  # the worst single token of any layer
    logit_kl_mean: float  # mean over positions of KL(reference || candidate), nats
    logit_kl_max: float
    top1_agreement: float  # fraction of positions whose argmax agrees
    num_tokens: int

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: [round(x, 6) for x in v] if isinstance(v, list) else (round(v, 6) if isinstance(v, float) else v)
                for k, v in d.items()}


def model_spec(model: str, num_layers: int | None = None) -> tuple[ModelSpec, Path | None]:
    """A checkpoint directory's spec, or a named shape's (random weights: no directory), the latter cut to its
    first `num_layers` decoder layers if given (a big shape's layers on a small machine)."""
    from railyard.shapes import is_shape, shape_config

    if is_shape(model) and not Path(model).exists():
        spec = ModelSpec.from_hf_config(shape_config(model))
        return (dataclasses.replace(spec, num_layers=num_layers) if num_layers else spec), None
    if num_layers:
        raise ValueError(f"num_layers cuts named shapes only, not the checkpoint {model}")
    model_dir = resolve_model_dir(model)
    return read_model_spec(model_dir), model_dir


def build_runner(model: str, prompts: list[list[int]], num_layers: int | None = None, **engine_args) -> ModelRunner:
    """A model runner (eager, no CUDA graphs) with a KV pool just big enough for one prefill of `prompts`."""
    spec, model_dir = model_spec(model, num_layers)
    block_size = engine_args.pop("block_size", 16)
    blocks = sum(-(-len(p) // block_size) for p in prompts) + 1
    config = EngineConfig(model=model, block_size=block_size, num_gpu_blocks=blocks, enforce_eager=True,
                          max_num_seqs=max(1, len(prompts)), **engine_args)
    config.resolve(spec.max_position_embeddings)
    return ModelRunner(config, spec, model_dir)


def hidden_state(x, residual: torch.Tensor) -> torch.Tensor:
    """A decoder layer's output (x, residual) as the hidden state x + residual in float32; x may still be an FP8
    GEMM's accumulator whose scales the next RMSNorm applies (layers/fp8.py ScaledAccumulator)."""
    if isinstance(x, ScaledAccumulator):
        x = x.materialize()
    return x.float() + residual.float()


def fresh_block_tables(prompts: list[list[int]], block_size: int) -> list[list[int]]:
    """Each prompt's blocks, fresh and laid out one sequence after another."""
    tables, next_block = [], 0
    for p in prompts:
        tables.append(list(range(next_block, next_block + -(-len(p) // block_size))))
        next_block += len(tables[-1])
    return tables


def prefill_plan(prompts: list[list[int]], tables: list[list[int]], block_size: int, last_only: bool) -> StepPlan:
    """One prefill step of every prompt into its blocks; logits of every position, or of each prompt's last."""
    ids, positions, slots, starts = [], [], [], [0]
    for p, table in zip(prompts, tables):
        ids += p
        positions += range(len(p))
        slots += [table[i // block_size] * block_size + i % block_size for i in range(len(p))]
        starts.append(starts[-1] + len(p))
    rows = [end - 1 for end in starts[1:]] if last_only else list(range(len(ids)))
    return StepPlan(ids, positions, slots, starts, [len(p) for p in prompts], tables, rows, [], [])


@contextlib.contextmanager
def layer_outputs(runner: ModelRunner) -> Iterator[list[list[torch.Tensor]]]:
    """Per decoder layer, the hidden states (float32) of every forward pass run inside."""
    layers: list[list[torch.Tensor]] = [[] for _ in runner.model.model.layers]

    def keeper(i: int):
        def keep(module, args, kwargs, output) -> None:
            x, residual = output  # a layer hands on (its output, the residual stream): their sum is its hidden state
            n = kwargs.get("num_tokens")  # the step's own rows, where the runner padded it (row_buckets.py)
            layers[i].append(hidden_state(x, residual)[:n])
        return keep

    hooks = [layer.register_forward_hook(keeper(i), with_kwargs=True)
             for i, layer in enumerate(runner.model.model.layers)]
    try:
        yield layers
    finally:
        for h in hooks:
            h.remove()


def with_adapter(plan: StepPlan, runner: ModelRunner, lora: LoRARequest | None, load: bool) -> StepPlan:
    """The plan with every sequence under the adapter (in slot 0, loaded first if `load`), where the runner serves
    adapters; else as it is."""
    if lora is not None and runner.lora is not None:
        plan.lora_slots = [0] * len(plan.seq_lens)
        plan.lora_loads = [(0, lora)] if load else []
    return plan


def prefill(runner: ModelRunner, prompts: list[list[int]], lora: LoRARequest | None = None) -> PrefillOutputs:
    """One prefill step of every prompt (fresh blocks, laid out one sequence after another)."""
    bs = runner.block_size
    plan = with_adapter(prefill_plan(prompts, fresh_block_tables(prompts, bs), bs, last_only=False), runner, lora, True)
    with layer_outputs(runner) as layers:
        logits = runner.compute_logits(plan)
    return PrefillOutputs([torch.cat(x) for x in layers], logits.float())


def prefill_then_decode(runner: ModelRunner, prompts: list[list[int]], decode_tokens: int,
                        lora: LoRARequest | None = None) -> PrefillOutputs:
    """Each prompt's last `decode_tokens` tokens fed one decode step at a time (teacher-forced) after a prefill of
    the rest: the layer outputs and logits of those decode positions only, [len(prompts) * decode_tokens, ...]
    ordered step by step. Decode steps read the cache through the decode kernel, which prefill never runs."""
    bs = runner.block_size
    heads = [p[:-decode_tokens] for p in prompts]
    tables = fresh_block_tables(prompts, bs)
    runner.compute_logits(with_adapter(prefill_plan(heads, tables, bs, last_only=True), runner, lora, True))
    logits: list[torch.Tensor] = []
    with layer_outputs(runner) as layers:
        for step in range(decode_tokens):
            pos = [len(h) + step for h in heads]
            plan = StepPlan([p[n] for p, n in zip(prompts, pos)], pos,
                            [t[n // bs] * bs + n % bs for t, n in zip(tables, pos)], list(range(len(prompts) + 1)),
                            [n + 1 for n in pos], tables, list(range(len(prompts))), [], [])
            logits.append(runner.compute_logits(with_adapter(plan, runner, lora, False)).float())
    return PrefillOutputs([torch.cat(x) for x in layers], torch.cat(logits))


def compare(reference: PrefillOutputs, candidate: PrefillOutputs, chunk: int = 256) -> Comparison:
    if len(reference.layers) != len(candidate.layers) or reference.logits.shape != candidate.logits.shape:
        raise ValueError("reference and candidate must be the same model over the same prompts")
    cosines, worst = [], 1.0
    for a, b in zip(reference.layers, candidate.layers):
        cos = F.cosine_similarity(a, b, dim=-1)
        cosines.append(cos.mean().item())
        worst = min(worst, cos.min().item())
    kls, agree = [], 0
    for i in range(0, reference.logits.shape[0], chunk):  # [chunk, vocab] at a time: 7B vocabularies are big
        ref, cand = reference.logits[i:i + chunk], candidate.logits[i:i + chunk]
        log_p, log_q = F.log_softmax(ref, dim=-1), F.log_softmax(cand, dim=-1)
        kls.append((log_p.exp() * (log_p - log_q)).sum(-1))
        agree += (ref.argmax(-1) == cand.argmax(-1)).sum().item()
    kl = torch.cat(kls)
    n = reference.logits.shape[0]
    return Comparison(cosines, worst, kl.mean().item(), kl.max().item(), agree / n, n)


def compare_prefill(model: str, prompts: list[list[int]], reference_args: dict,
                    candidates: dict[str, dict], decode_tokens: int = 0, lora: LoRARequest | None = None,
                    **common_args) -> dict[str, Comparison]:
    """Each candidate's engine arguments against the reference's (same model, weights, prompts).

    decode_tokens > 0: compare the last decode_tokens positions of each prompt fed as decode steps
    (prefill_then_decode) instead of one prefill. lora: the adapter every prompt runs under in the runners built
    with enable_lora. One runner lives at a time (a 7B reference and its FP8 twin
    need not share the GPU)."""
    def run(runner: ModelRunner) -> PrefillOutputs:
        if decode_tokens:
            return prefill_then_decode(runner, prompts, decode_tokens, lora)
        return prefill(runner, prompts, lora)

    ref_runner = build_runner(model, prompts, **common_args, **reference_args)
    reference = run(ref_runner)
    del ref_runner
    results = {}
    for name, args in candidates.items():
        runner = build_runner(model, prompts, **common_args, **args)
        results[name] = compare(reference, run(runner))
        del runner
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


def greedy_agreement(reference: list[list[int]], candidate: list[list[int]]) -> dict:
    """Free-running greedy outputs: the fraction of positions that agree, of tokens before each sequence's
    first disagreement, and of sequences that agree entirely."""
    total = sum(len(r) for r in reference)
    same = prefix = whole = 0
    for r, c in zip(reference, candidate, strict=True):
        same += sum(a == b for a, b in zip(r, c))
        k = next((i for i, (a, b) in enumerate(zip(r, c)) if a != b), min(len(r), len(c)))
        prefix += k
        whole += r == c
    return {"position_agreement": same / total, "prefix_agreement": prefix / total,
            "sequences_identical": whole / len(reference), "num_tokens": total}
