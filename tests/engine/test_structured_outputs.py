"""Constrained decoding in the engine: constrained outputs follow their grammar, and unconstrained requests that
share their batches keep exactly the greedy tokens of a run without any constrained request, through
asynchronous scheduling, preemption (recompute and swap), prefix caching, chunked prefill and n > 1.
(Tensor parallelism: tests/engine/runner/test_tensor_parallel.py.)"""

from __future__ import annotations

import json
import random
import re
import threading

import jsonschema
import pytest
import torch

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.structured import StructuredOutputsParams
from railyard.engine.structured.compiler import GrammarCompiler
from railyard.engine.runner.logits_mask import apply_bitmask
from railyard.engine.structured.manager import Accepted, StructuredOutputManager
from railyard.engine.tokenizer import load_tokenizer
from tests.engine.recording_executor import RecordingExecutor

_rng = random.Random(3)
_shared = [_rng.randrange(256) for _ in range(24)]
PROMPTS = [[_rng.randrange(256) for _ in range(n)] for n in (5, 19, 40, 11, 33)] + [_shared + [1, 2, 3], _shared + [9]]
SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["a", "bb", "ccc"]},
    "xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3}},
    "required": ["id", "tag", "xs"]}
REGEX = r"[a-f]{2,4}-(\d{2}|x)"
CONSTRAINED = [
    SamplingParams(temperature=0.0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
    SamplingParams(temperature=1.0, seed=4, n=2, max_tokens=80, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
    SamplingParams(temperature=0.8, seed=9, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=REGEX)),
    SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
]
UNCONSTRAINED = [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                 SamplingParams(temperature=0.0, n=2, max_tokens=16, ignore_eos=True),
                 SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[7, 101])]

SCENARIOS = {
    "async": dict(),
    "prefix-cache-chunked": dict(block_size=8, max_num_batched_tokens=24),
    "preempt-recompute": dict(block_size=8, num_gpu_blocks=22, max_model_len=128, preemption_mode="recompute"),
    "preempt-swap": dict(block_size=8, num_gpu_blocks=22, max_model_len=128, preemption_mode="swap",
                         num_cpu_blocks=64),
}


def run(model: str, with_constrained: bool, **cfg) -> tuple[dict, dict, Engine]:
    """(unconstrained outputs, constrained outputs, engine): token ids, text and finish reason per request."""
    cfg = {"device": "cpu", "structured_outputs_disable_any_whitespace": True, **cfg}
    engine = Engine(EngineConfig(model=model, **cfg))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"u{i}", None, UNCONSTRAINED[i % len(UNCONSTRAINED)], prompt_token_ids=prompt)
        if with_constrained:
            # ASCII prompts (ids below 94 are '!'..'~'): a prompt ending mid-character would give the output's
            # text a leading U+FFFD (the detokenizer is primed with the prompt's last tokens)
            engine.add_request(f"c{i}", None, CONSTRAINED[i % len(CONSTRAINED)],
                               prompt_token_ids=[t % 94 for t in prompt[::-1]])
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None
            if out.finished:
                done[out.request_id] = [(c.token_ids, c.text, c.finish_reason) for c in out.outputs]
    engine.check_invariants()
    return ({k: v for k, v in done.items() if k[0] == "u"}, {k: v for k, v in done.items() if k[0] == "c"}, engine)


def assert_follows(request_id: str, outputs) -> None:
    spec = CONSTRAINED[int(request_id[1:]) % len(CONSTRAINED)].structured_outputs
    for _, text, reason in outputs:
        assert reason == "stop", (request_id, text)
        if spec.json is not None:
            jsonschema.validate(json.loads(text), spec.json)
        elif spec.regex is not None:
            assert re.fullmatch(spec.regex, text)
        else:
            assert text in spec.choice


@pytest.fixture(scope="module")
def alone(tiny_model):
    return run(tiny_model, with_constrained=False)[0]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Both kinds of request, one step at a time with ample memory."""
    return run(tiny_model, with_constrained=True, async_scheduling=False)[:2]


def test_constrained_outputs_are_valid(reference):
    assert len(reference[1]) == len(PROMPTS)
    for request_id, outputs in reference[1].items():
        assert_follows(request_id, outputs)


def test_unconstrained_neighbours_keep_their_greedy_tokens(alone, reference):
    assert reference[0] == alone


@pytest.mark.parametrize("scenario", ["async", "prefix-cache-chunked", "preempt-recompute", "preempt-swap"])
def test_both_kinds_of_output_are_unchanged_by_async_scheduling_preemption_and_prefix_caching(tiny_model, alone,
                                                                                              reference, scenario):
    """The unconstrained greedy tokens stay those of a run without constrained requests; the constrained outputs
    stay the reference's (a matcher only ever sees the tokens the engine keeps, so recompute and swap need no
    rollback)."""
    unconstrained, constrained, engine = run(tiny_model, with_constrained=True, **SCENARIOS[scenario])
    assert unconstrained == alone
    assert constrained == reference[1]
    if scenario.startswith("preempt"):
        assert engine.stats().num_preemptions_total > 0
    if scenario.startswith("prefix"):
        assert engine.stats().prefix_cache_hits > 0


def test_tensor_parallel_masks_on_rank_0_and_changes_nothing_else(tiny_model, alone, reference):
    """Two gloo ranks on the CPU: rank 0 samples, so the bitmask is applied there alone."""
    unconstrained, constrained, engine = run(tiny_model, with_constrained=True, tensor_parallel_size=2)
    try:
        assert unconstrained == alone
        assert constrained == reference[1]
    finally:
        engine.shutdown()


def test_a_complete_grammar_ends_the_request_even_with_ignore_eos(tiny_model):
    engine = Engine(EngineConfig(model=tiny_model, device="cpu"))
    engine.add_request("r", "x", SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True,
                                                structured_outputs=StructuredOutputsParams(choice=["done"])))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    final = outs[-1].outputs[0]
    assert final.text == "done" and final.finish_reason == "stop"
    assert final.token_ids[-1] in engine.eos_token_ids  # the grammar's end: its EOS, then nothing


def test_a_first_seen_grammar_compiles_while_other_requests_keep_stepping(tiny_model, monkeypatch):
    release = threading.Event()
    compile_grammar = GrammarCompiler._compile

    def slow_compile(self, spec):
        assert release.wait(60)
        return compile_grammar(self, spec)

    monkeypatch.setattr(GrammarCompiler, "_compile", slow_compile)
    engine = Engine(EngineConfig(model=tiny_model, device="cpu", structured_outputs_disable_any_whitespace=True))
    engine.add_request("plain", None, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
                       prompt_token_ids=PROMPTS[0])
    engine.add_request("json", None, CONSTRAINED[0], prompt_token_ids=PROMPTS[1])
    finished = {}
    while "plain" not in finished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert "json" not in finished and engine.core.structured.num_compiling == 1  # still compiling; plain is done
    release.set()
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert_follows("c0", [(None, finished["json"].outputs[0].text, finished["json"].outputs[0].finish_reason)])


def test_a_grammar_that_fails_to_compile_ends_only_its_request_with_an_error(tiny_model, monkeypatch):
    def failing_compile(self, spec):
        raise RuntimeError("[12:00:00] /project/cpp/compiler.cc:1: out of memory")

    monkeypatch.setattr(GrammarCompiler, "_compile", failing_compile)
    engine = Engine(EngineConfig(model=tiny_model, device="cpu"))
    engine.add_request("plain", None, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                       prompt_token_ids=PROMPTS[0])
    engine.add_request("json", None, CONSTRAINED[0], prompt_token_ids=PROMPTS[1])
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["json"].error == "the constraint could not be compiled: out of memory"
    assert finished["json"].outputs[0].finish_reason == "abort"
    assert finished["plain"].error is None and len(finished["plain"].outputs[0].token_ids) == 5
    engine.check_invariants()


def test_equal_constraints_share_one_compile(tiny_model):
    engine = Engine(EngineConfig(model=tiny_model, device="cpu", structured_outputs_disable_any_whitespace=True))
    for i in range(3):  # the same schema, written three ways
        schema = SCHEMA if i == 0 else json.dumps(SCHEMA, indent=i) if i == 1 else dict(reversed(SCHEMA.items()))
        engine.add_request(f"r{i}", "x", SamplingParams(temperature=0.0, max_tokens=60,
                                                        structured_outputs=StructuredOutputsParams(json=schema)))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.core.structured._compiler.num_compiled == 1


def test_ids_past_the_tokenizer_are_never_allowed(tiny_model):
    """A named shape serves a 152,064-token model through the 259-token byte-level tokenizer: the grammar covers
    the tokenizer's ids, every id past them is masked too, and the EOS the tokenizer has ends a grammar."""
    vocab, eos = 152_064, (151_643, 258)
    tokenizer = load_tokenizer(tiny_model)
    manager = StructuredOutputManager(lambda: tokenizer, vocab, eos)

    class Seq:
        seq_id, request_id, is_finished = 0, "r", False

    manager.add("r", [Seq], StructuredOutputsParams(regex="ab"))
    ready, failed = manager.take_ready(wait_s=30)
    assert ready == [Seq] and not failed
    allowed = []
    for step in range(3):
        mask = manager.bitmask([Seq])
        logits = torch.zeros(1, vocab)
        apply_bitmask(logits, mask)
        allowed.append(set(torch.nonzero(logits[0] == 0).flatten().tolist()))
        if step < 2:
            assert manager.accept(Seq, min(allowed[-1])) is Accepted.OK
    assert allowed == [set(tokenizer.encode("a")), set(tokenizer.encode("b")), {258}]
    assert manager.accept(Seq, 258) is Accepted.TERMINATED


def test_a_constrained_steps_mask_is_filled_off_the_step_loop_and_its_sampling_queued_just_before_the_next_forward(
        tiny_model, monkeypatch):
    """With asynchronous scheduling the bitmask is filled on the manager's thread while the loop returns outputs and
    schedules, and a step's sampling goes to the device right before the next step's forward pass, with no wait
    for the device between the two (the device runs them back to back)."""
    import xgrammar as xgr

    events: list[str] = []
    fill = xgr.BatchGrammarMatcher.batch_fill_next_token_bitmask

    def recording_fill(self, *args, **kwargs):  # xgrammar's own fill, watched for the thread it runs on
        events.append("fill@" + threading.current_thread().name.split("_")[0])
        return fill(self, *args, **kwargs)

    monkeypatch.setattr(xgr.BatchGrammarMatcher, "batch_fill_next_token_bitmask", recording_fill)
    engine = Engine(EngineConfig(model=tiny_model, device="cpu", structured_outputs_disable_any_whitespace=True))
    engine.core.executor = RecordingExecutor(engine.core.executor, events)
    engine.add_request("json", None, CONSTRAINED[0], prompt_token_ids=PROMPTS[1])
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert_follows("c0", [(None, outputs[-1].outputs[0].text, outputs[-1].outputs[0].finish_reason)])
    launches = [e for e in events if not e.startswith("fill")]
    assert set(e for e in events if e.startswith("fill")) == {"fill@railyard-bitmask"}
    # the prefill's forward; next step: its sampling, the first decode's forward, then the wait for the prefill's token
    assert launches[:4] == ["forward", "sample", "forward", "wait"]
    # every later sampling is followed at once by the next forward pass; the last one (nothing left to schedule) by
    # the wait for its tokens
    after_sample = [launches[i + 1] for i, event in enumerate(launches) if event == "sample"]
    assert after_sample[:-1] == ["forward"] * (len(after_sample) - 1) and after_sample[-1] == "wait", launches
