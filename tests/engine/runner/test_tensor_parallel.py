"""Tensor parallelism on CPU (gloo): the same greedy tokens as one process and as HF transformers,
and a replica whose worker dies fails fast with EngineDeadError instead of hanging.

Every case runs the tiny vocabulary of 259 tokens, which divides by neither 2 nor 4, so the
vocab-parallel embedding and LM head always carry a padded last shard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from railyard.engine.config import EngineConfig, SamplingParams
from railyard.engine.engine import Engine
from railyard.engine.llm import LLM
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from railyard.errors import ConfigError, EngineDeadError
from tests.engine.hf_oracle import hf_greedy

pytestmark = pytest.mark.slow  # spawns tensor-parallel worker processes

MAX_NEW = 16
PROMPTS = [[(7 * i + 3 * n) % 256 for i in range(n)] for n in (3, 9, 17, 33, 40)]
# A KV pool too small for the whole batch: sequences get swapped out and back in on every rank.
ENGINE = dict(device="cpu", block_size=8, num_gpu_blocks=20, max_model_len=64, preemption_mode="swap",
              num_cpu_blocks=64)

# (architecture, KV heads, tensor_parallel_size); the tiny models have 4 attention heads.
CASES = {
    "qwen2-kv2-tp2": ("qwen2", 2, 2),  # one KV head per rank
    "qwen2-kv2-tp4": ("qwen2", 2, 4),  # KV heads fewer than ranks: each replicated on 2 ranks
    "llama-kv1-tp4": ("llama", 1, 4),  # a single KV head replicated on all 4 ranks (llama3 rope scaling)
    "qwen3-kv4-tp2": ("qwen3", 4, 2),  # two KV heads per rank; tied embeddings; q/k norm
    "qwen3moe-kv2-tp2": ("qwen3moe", 2, 2),  # every expert's intermediate width split over the ranks
}


def _generate(path: str, tp: int) -> tuple[list[list[int]], int]:
    """Greedy tokens for PROMPTS, and how many preemptions it took, with tensor_parallel_size tp."""
    llm = LLM(path, tensor_parallel_size=tp, **ENGINE)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], llm.engine.stats().num_preemptions_total
    finally:
        llm.engine.shutdown()


class _Runs:
    """Each checkpoint and each (checkpoint, tp) generation made once for the module's tests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._memo: dict[tuple, object] = {}

    def _once(self, key: tuple, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def checkpoint(self, arch: str, kv_heads: int) -> str:
        return self._once(("ckpt", arch, kv_heads), lambda: str(
            write_tiny_checkpoint(self.root / f"{arch}-kv{kv_heads}", arch, num_key_value_heads=kv_heads)))

    def engine(self, arch: str, kv_heads: int, tp: int) -> tuple[list[list[int]], int]:
        return self._once(("engine", arch, kv_heads, tp), lambda: _generate(self.checkpoint(arch, kv_heads), tp))

    def hf(self, arch: str, kv_heads: int) -> list[list[int]]:
        return self._once(("hf", arch, kv_heads), lambda: hf_greedy(self.checkpoint(arch, kv_heads), PROMPTS, MAX_NEW))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> _Runs:
    return _Runs(tmp_path_factory.mktemp("tp-models"))


@pytest.fixture(scope="module")
def tp2_checkpoint(runs) -> str:
    return runs.checkpoint("qwen2", 2)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_match_hf_generate(runs, case):
    arch, kv_heads, tp = CASES[case]
    tokens, _ = runs.engine(arch, kv_heads, tp)
    assert tokens == runs.hf(arch, kv_heads)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_match_one_process(runs, case):
    arch, kv_heads, tp = CASES[case]
    tokens, _ = runs.engine(arch, kv_heads, tp)
    assert tokens == runs.engine(arch, kv_heads, 1)[0]


@pytest.mark.parametrize("case", list(CASES))
def test_swap_preemption_ran_on_every_rank(runs, case):
    """The small KV pool forced swaps, so the matching tokens above went through swap-out and swap-in."""
    _, preemptions = runs.engine(*CASES[case])
    assert preemptions > 0


def test_killed_worker_fails_generation_fast_with_engine_dead_error(tp2_checkpoint):
    engine = Engine(EngineConfig(model=tp2_checkpoint, tensor_parallel_size=2, **ENGINE))
    try:
        engine.add_request("long", None, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True),
                           prompt_token_ids=[1, 2, 3])
        engine.step()
        victim = engine.executor.worker_pids[0]
        killer = threading.Timer(0.1, os.kill, (victim, signal.SIGKILL))  # lands mid-generation
        killer.start()
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"worker rank 1 .*killed by SIGKILL"):
            while engine.has_unfinished_requests():
                engine.step()
        killer.join()
        assert time.monotonic() - started < 30, "liveness bound: the driver must not wait on a dead peer"
        with pytest.raises(EngineDeadError):  # and it stays dead rather than hanging on the next step
            engine.step()
    finally:
        engine.shutdown()


def test_health_check_reports_a_worker_that_died_while_idle(tp2_checkpoint):
    engine = Engine(EngineConfig(model=tp2_checkpoint, tensor_parallel_size=2, **ENGINE))
    try:
        engine.executor.check_health()  # all well: returns quietly
        victim = engine.executor.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        with pytest.raises(EngineDeadError, match=rf"worker rank 1 \(pid {victim}\) died \(killed by SIGKILL\)"):
            while time.monotonic() < deadline:
                engine.executor.check_health()
                time.sleep(0.05)
    finally:
        engine.shutdown()


def test_shutdown_stops_workers_and_leaves_the_process_group(tp2_checkpoint):
    engine = Engine(EngineConfig(model=tp2_checkpoint, tensor_parallel_size=2, **ENGINE))
    pids = engine.executor.worker_pids
    engine.shutdown()
    assert not any(_alive(pid) for pid in pids)
    assert not dist.is_initialized()  # so another tensor-parallel engine can start in this process


_ORPHAN_SCRIPT = """
import sys, time
from railyard.engine.config import EngineConfig
from railyard.engine.engine import Engine

if __name__ == "__main__":
    engine = Engine(EngineConfig(model=sys.argv[1], tensor_parallel_size=2, device="cpu", block_size=8,
                                 num_gpu_blocks=16, max_model_len=64))
    print(*engine.executor.worker_pids, flush=True)
    time.sleep(600)
"""


def test_workers_exit_when_the_engine_process_is_killed(tmp_path, tp2_checkpoint):
    script = tmp_path / "engine_process.py"
    script.write_text(_ORPHAN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(script), tp2_checkpoint], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert pids and all(_alive(pid) for pid in pids)
    finally:
        parent.kill()  # SIGKILL: no cleanup code of the engine's runs
        parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def test_size_that_does_not_divide_the_heads_is_a_config_error(tp2_checkpoint):
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        Engine(EngineConfig(model=tp2_checkpoint, tensor_parallel_size=3, **ENGINE))


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (an unreaped orphan has finished)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
