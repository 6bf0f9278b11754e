"""Sampling parameters behave as vLLM users expect; logprobs agree with HF transformers' logits."""

from __future__ import annotations

import pytest
import torch

from railyard import LLM, SamplingParams
from tests.engine.hf_oracle import hf_model

PROMPT = [10, 20, 30, 40, 50, 60, 70]


@pytest.fixture(scope="module")
def llm(tiny_model):
    return LLM(tiny_model)


def _gen(llm, params, prompts=(PROMPT,)):
    return llm.generate(prompt_token_ids=[list(p) for p in prompts], sampling_params=params, use_tqdm=False)


def _ids(out, i=0):
    return out.outputs[i].token_ids


def test_same_seed_gives_the_same_sample_and_batch_mates_do_not_matter(llm):
    p = SamplingParams(temperature=1.0, seed=42, max_tokens=16, ignore_eos=True)
    alone = _ids(_gen(llm, p)[0])
    crowded = _gen(llm, [SamplingParams(temperature=1.3, max_tokens=9, ignore_eos=True), p,
                         SamplingParams(temperature=0.0, max_tokens=5)], [[1, 2, 3], PROMPT, [4, 5]])
    assert _ids(crowded[1]) == alone
    assert _ids(_gen(llm, SamplingParams(temperature=1.0, seed=43, max_tokens=16, ignore_eos=True))[0]) != alone


def test_top_k_one_and_tiny_top_p_and_min_p_one_equal_greedy(llm):
    greedy = _ids(_gen(llm, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0])
    for kw in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)):
        p = SamplingParams(temperature=1.0, seed=1, max_tokens=12, ignore_eos=True, **kw)
        assert _ids(_gen(llm, p)[0]) == greedy, kw


def test_top_k_restricts_samples_to_the_k_most_likely_first_tokens(llm, tiny_model):
    with torch.no_grad():
        logits = hf_model(tiny_model)(torch.tensor([PROMPT])).logits[0, -1]
    top3 = set(logits.topk(3).indices.tolist())
    firsts = {_ids(_gen(llm, SamplingParams(temperature=5.0, top_k=3, seed=s, max_tokens=1))[0])[0]
              for s in range(40)}
    assert firsts <= top3 and len(firsts) > 1


def test_repetition_penalty_greedy_matches_hf_generate_with_the_same_penalty(llm, tiny_model):
    ours = _ids(_gen(llm, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                         repetition_penalty=1.8))[0])
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = hf_model(tiny_model).generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                                            repetition_penalty=1.8, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert ours == ref
    assert ours != _ids(_gen(llm, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0])


def test_frequency_and_presence_penalties_reduce_repetition(llm):
    base = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = _ids(_gen(llm, base)[0])
    pen = _ids(_gen(llm, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                                        frequency_penalty=2.0, presence_penalty=2.0))[0])
    assert len(set(pen)) >= len(set(plain))


def test_logprobs_match_hf_log_softmax_and_include_the_sampled_token(llm, tiny_model):
    out = _gen(llm, SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))[0].outputs[0]
    with torch.no_grad():
        ref = hf_model(tiny_model)(torch.tensor([PROMPT])).logits[0, -1].log_softmax(-1)
    entry = out.logprobs[0]
    top = ref.topk(5)
    assert set(top.indices.tolist()) <= set(entry)
    for tid, lp in entry.items():
        assert lp == pytest.approx(ref[tid].item(), abs=1e-4)
    assert out.token_ids[0] in entry
    assert out.cumulative_logprob == pytest.approx(entry[out.token_ids[0]])


def test_n_returns_n_distinct_samples_of_the_same_prompt(llm):
    out = _gen(llm, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_max_tokens_and_min_tokens(llm):
    out = _gen(llm, SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"
    greedy_first = out.token_ids[0]
    held = _gen(llm, SamplingParams(temperature=0.0, max_tokens=7, min_tokens=3,
                                    stop_token_ids=[greedy_first]))[0].outputs[0]
    assert greedy_first not in held.token_ids[:3]


def test_stop_token_ids_end_generation_with_that_token_as_reason(llm):
    full = _ids(_gen(llm, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0])
    stop = full[4]
    out = _gen(llm, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == full[: full.index(stop) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_stop_string_ends_generation_and_is_not_emitted(llm):
    tok = llm.tokenizer
    full = _gen(llm, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True), [tok.encode("abc")])[0]
    text = full.outputs[0].text
    clean = [ch for ch in text if ch.isprintable() and ch != "\ufffd"]
    assert clean, "the tiny model should produce some printable text"
    stop = clean[len(clean) // 2]
    out = _gen(llm, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop]),
               [tok.encode("abc")])[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text
    assert out.text == text[: text.index(stop)]


def test_eos_ends_generation_unless_ignored(llm):
    eos = llm.engine.eos_token_ids
    outs = _gen(llm, SamplingParams(temperature=1.0, seed=0, max_tokens=200), [[i] * 3 for i in range(40)])
    stopped = [o.outputs[0] for o in outs if o.outputs[0].finish_reason == "stop"]
    assert stopped and all(c.token_ids[-1] in eos for c in stopped)
    ignored = _gen(llm, SamplingParams(temperature=1.0, seed=0, max_tokens=50, ignore_eos=True),
                   [[i] * 3 for i in range(10)])
    assert all(o.outputs[0].finish_reason == "length" for o in ignored)
