"""Imports run one way (docs/architecture.md): api -> engine, serve -> api/engine, cluster -> the stack config only, and
every layer -> the shared torch-free modules; never from a lower layer to a higher one.

Read from the source with ast, so imports inside functions (the lazy ones) count as much as the top ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "railyard"

# part of the package -> the parts it may import
SHARED = "shared"  # railyard.errors, railyard.envs, railyard.shapes, railyard.model: torch-free, below every layer
ALLOWED: dict[str, set[str]] = {
    SHARED: {SHARED},
    "stack": {"stack", SHARED},
    "engine": {"engine", SHARED},
    "api": {"api", "engine", SHARED},
    "bench": {"bench", "engine", SHARED},
    "serve": {"serve", "api", "engine", "stack", SHARED},
    "cluster": {"cluster", "stack", SHARED},
}
TOP = {"railyard", "railyard.cli"}  # the package's lazy facade and the command dispatcher: above every layer


def part(module: str) -> str:
    """Which part of the package a module (railyard.x.y) belongs to."""
    name = module.split(".")[1]
    return SHARED if name in ("errors", "envs", "shapes", "model") else name


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, railyard's and others', at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "railyard":  # from railyard import errors
                found += [(node.lineno, f"railyard.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p) not in TOP)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_from_a_lower_layer_to_a_higher_one(path):
    mine = part(module_name(path))
    wrong = [f"line {line}: {module} ({part(module)})" for line, module in imports(path)
             if module.startswith("railyard.") and part(module) not in ALLOWED[mine]]
    assert wrong == [], f"{mine} may import only {sorted(ALLOWED[mine])}"


@pytest.mark.parametrize("path", [p for p in SOURCES if part(module_name(p)) == SHARED],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_shared_modules_are_torch_free(path):
    assert [m for _, m in imports(path) if m.split(".")[0] in ("torch", "triton", "ray")] == []


# Inside the engine, from the bottom up: a module may import its own level and those below it.
# The longest matching prefix (below railyard.engine) names a module's level.
ENGINE_LEVELS: list[tuple[str, ...]] = [
    ("startup",),  # timings, the tiny model, on-disk caches
    ("config", "outputs", "tokenizer", "exits", "structured.params", "structured.grammar",
     "lora.request", "lora.peft"),  # plain data, tools (LoRA: the request type, the PEFT adapter reader)
    ("sched", "lora"),  # what to run: sequences, KV blocks, the scheduler, LoRA slots (no torch)
    ("runner", "structured"),  # how to run it: tensors, graphs, kernels, models; grammars compiled for a step
    ("core",),  # the step loop and its process
    ("client",),  # the front's side of the process boundary
    ("engine", "llm", "args", "cli"),  # entry points
]
ENGINE_LEVEL = {prefix: level for level, prefixes in enumerate(ENGINE_LEVELS) for prefix in prefixes}


def engine_level(module: str) -> int:
    """The level of railyard.engine.<rest>: its longest prefix in ENGINE_LEVELS."""
    parts = module.split(".")[2:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ENGINE_LEVEL:
            return ENGINE_LEVEL[".".join(parts[:n])]
    raise AssertionError(f"{module} has no level in ENGINE_LEVELS")


ENGINE_SOURCES = [p for p in SOURCES if module_name(p).startswith("railyard.engine.")]


@pytest.mark.parametrize("path", ENGINE_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_inside_the_engine_imports_run_from_the_entry_points_down_to_start_up(path):
    mine = engine_level(module_name(path))
    wrong = [f"line {line}: {module}" for line, module in imports(path)
             if module.startswith("railyard.engine.") and engine_level(module) > mine]
    assert wrong == [], f"level {mine} ({ENGINE_LEVELS[mine]}) imports a higher level"


def test_the_api_does_not_import_the_serve_layer():
    api = [m for p in (PACKAGE / "api").rglob("*.py") for _, m in imports(p)]
    assert not [m for m in api if m.startswith("railyard.serve")]
