"""GPU check for the one HF-equality failure of 2026-12-03 (BENCHMARKS.md, "Mixed steps as piecewise CUDA
graphs"): qwen3, recompute preemption, greedy tokens against HF generate, with piecewise CUDA graphs off (0)
or on (1), so one call tells whether the pieces cause the device-side assert.

    for p in 0 1; do CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 scripts/gpu/preempt_recompute_check.py $p; done
"""
import os, sys, tempfile, traceback
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from railyard import LLM, SamplingParams
from railyard.engine.startup.tiny_model import write_tiny_checkpoint
from tests.engine.hf_oracle import hf_greedy
from tests.engine.test_hf_equivalence import PROMPTS, MAX_NEW, VARIANTS
path = str(write_tiny_checkpoint(tempfile.mkdtemp() + "/qwen3", "qwen3"))
exp = hf_greedy(path, PROMPTS, MAX_NEW)
pw = sys.argv[1] == "1"
try:
    llm = LLM(path, piecewise_cuda_graphs=pw, **VARIANTS["preempt-recompute"])
    got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True), use_tqdm=False)]
    print("piecewise", pw, "equal", got == exp, flush=True)
except Exception:
    print("piecewise", pw, "ERROR", traceback.format_exc()[-1500:], flush=True)
