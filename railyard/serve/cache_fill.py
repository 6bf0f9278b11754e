"""`railyard cache fill --config stack.yaml`: start each engine a stack deploys once, here, then stop it, so the
kernels its start-up warm-up compiles (every kind of step its limits allow, and structured outputs' mask) land in
$RAILYARD_CACHE, where the stack's replicas will find them.

Triton keys each kernel by its source, the GPU and the compiler, so fill where the replicas run: on the stack's GPU
product, with the image's software, into the directory the stack's kernel_cache names (in a container of the
image, committed for mode image; on the node for mode node). Deployments with the same engine options are filled
once: they compile the same kernels.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from railyard.engine.config import EngineConfig
from railyard.engine.tokenizer import with_shape_tokenizer
from railyard.errors import ConfigError
from railyard.serve.spec import parse_app_args
from railyard.stack import Stack, to_serve_config


@dataclass
class Filled:
    """One engine start of a fill: the deployments it stands for and how it met the kernel cache."""

    deployments: list[str]
    kernel_cache: str | None  # cold, warm or partial (None: nothing JIT'd, e.g. on the CPU)
    triton_kernels: int
    triton_compiled: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def engine_groups(stack: Stack, models: list[str] | None = None) -> list[tuple[dict, list[str]]]:
    """(engine options, deployments) for each distinct engine the stack (or its named models) deploys."""
    spec = parse_app_args(to_serve_config(stack)["applications"][0]["args"])
    known = [m.name for m in spec.models]
    missing = sorted(set(models or []) - set(known))
    if missing:
        raise ConfigError(f"--model {', '.join(missing)}: the stack has no such model (it has {', '.join(known)})")
    groups: dict[str, tuple[dict, list[str]]] = {}
    for model in spec.models:
        if models and model.name not in models:
            continue
        for pool in model.pools:
            engine = dict(pool.engine)
            key = json.dumps(engine, sort_keys=True, default=str)
            groups.setdefault(key, (engine, []))[1].append(pool.deployment)
    return list(groups.values())


def fill(stack: Stack, models: list[str] | None = None, device: str | None = None) -> list[Filled]:
    """Start and stop each distinct engine of the stack here (device: override the engines' own)."""
    from railyard.engine.engine import Engine

    done = []
    for options, deployments in engine_groups(stack, models):
        config = EngineConfig(**{**options, **({"device": device} if device else {})})
        with_shape_tokenizer(config)  # as a replica does: a named shape speaks text, so its grammars set up too
        start = time.perf_counter()
        engine = Engine.from_config(config)
        try:
            engine.core.structured.prepare()
        finally:
            engine.shutdown()
        st = engine.core.startup
        done.append(Filled(deployments, st.kernel_cache, st.triton_kernels, st.triton_compiled,
                           round(time.perf_counter() - start, 3)))
    return done
