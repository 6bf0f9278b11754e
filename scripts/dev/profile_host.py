"""Host-side cost of the engine's step loop, without a model: the 256-prompt benchmark workload on a named
shape, with an executor that plans each step (as the model runner does) and returns token ids at once.

Usage: python3 scripts/dev/profile_host.py [qwen2-7b] [--cprofile] [--sync]   (prints ms per decode step)
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

sys.path.insert(0, __file__.rsplit("/scripts/", 1)[0])

from railyard.bench.throughput import workload_requests  # noqa: E402
from railyard.bench.workload import LengthRange  # noqa: E402
from railyard.engine.config import EngineConfig, SamplingParams  # noqa: E402
from railyard.engine.engine import Engine  # noqa: E402
from railyard.engine.runner.model_runner import ModelRunner, StepPlan  # noqa: E402
from railyard.model.spec import ModelSpec  # noqa: E402
from railyard.engine.runner.sampler import DoneSample, SamplerOutput  # noqa: E402
from railyard.shapes import shape_config  # noqa: E402


class PlanOnlyExecutor:
    """Plans every step like ModelRunner.plan and answers token 7 for every sampled row."""

    num_gpu_blocks, num_cpu_blocks, block_size = 200_000, 0, 16
    supports_async = "--sync" not in sys.argv

    def launch(self, out) -> DoneSample:
        plan: StepPlan = ModelRunner.plan(self, out)
        return DoneSample(SamplerOutput([7] * len(plan.sample_indices), [None] * len(plan.sample_indices)))

    def forget(self, seq_id: int) -> None:
        pass

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def main() -> None:
    name = next((a for a in sys.argv[1:] if not a.startswith("--")), "qwen2-7b")
    config = EngineConfig(model=name, max_num_batched_tokens=8192, device="cpu")
    eng = Engine(config, spec=ModelSpec.from_hf_config(shape_config(name)), executor=PlanOnlyExecutor())
    reqs = workload_requests(eng, 256, LengthRange(100, 1024), LengthRange(256, 256), 0)
    for i, r in enumerate(reqs):
        eng.add_request(f"p{i}", None, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True,
                                                                 output_kind="final_only"),
                        prompt_token_ids=r.prompt_token_ids)
    prof = cProfile.Profile() if "--cprofile" in sys.argv else None
    steps, start = 0, time.perf_counter()
    if prof:
        prof.enable()
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    if prof:
        prof.disable()
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.3f} s: {1000 * elapsed / steps:.2f} ms per step")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
