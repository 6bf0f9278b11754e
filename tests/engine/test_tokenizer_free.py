"""A checkpoint without tokenizer files serves token-id prompts, for every architecture alike (vLLM's
skip_tokenizer_init); text prompts are refused with a message saying why. HF transformers is the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from railyard.engine.config import SamplingParams
from railyard.engine.llm import LLM
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.engine.tokenizer import has_tokenizer_files, load_tokenizer
from railyard.errors import InvalidRequestError
from tests.engine.hf_oracle import hf_greedy

PROMPTS = [[5, 17, 99, 3], [200, 1, 2]]


def without_tokenizer(path: Path) -> str:
    """The checkpoint with its tokenizer files removed: config and weights only."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    assert not has_tokenizer_files(path)
    return str(path)


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "llama"])
def bare_checkpoint(request, tmp_path_factory) -> str:
    return without_tokenizer(write_tiny_checkpoint(tmp_path_factory.mktemp("bare") / request.param, request.param))


def test_loading_a_directory_without_tokenizer_files_gives_no_tokenizer(bare_checkpoint):
    assert load_tokenizer(bare_checkpoint) is None


def test_token_id_prompts_generate_what_hf_generates(bare_checkpoint):
    llm = LLM(bare_checkpoint, max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(bare_checkpoint, PROMPTS, 6)


def test_text_prompt_is_refused_saying_to_send_token_ids(bare_checkpoint):
    llm = LLM(bare_checkpoint, max_model_len=64)
    with pytest.raises(InvalidRequestError, match="token ids"):
        llm.generate(["hello"], use_tqdm=False)
