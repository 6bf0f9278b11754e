"""Every example stack renders in its own mode into manifests the Kubernetes and KubeRay schemas accept,
one shows the plain-Deployment mode (one engine, no Ray), and the mixture-of-experts one plans onto H200s."""

from __future__ import annotations

import pytest

from railyard.cluster.plan import plan_from_files
from railyard.cluster.render import render
from railyard.cluster.sizing import SHAPES
from railyard.cluster.validate import validate_objects
from railyard.stack import load_stack

from .conftest import EXAMPLES

STACKS = sorted(p.name for p in EXAMPLES.glob("stack*.yaml"))


@pytest.mark.parametrize("name", STACKS)
def test_example_stack_renders_manifests_that_validate(name):
    stack = load_stack(EXAMPLES / name)
    objects = render(stack)
    assert objects and validate_objects(objects, stack.kubernetes_version, name) == []


def test_an_example_renders_in_deployment_mode():
    deployment_stacks = [n for n in STACKS if load_stack(EXAMPLES / n).mode == "deployment"]
    assert deployment_stacks
    kinds = [o["kind"] for o in render(load_stack(EXAMPLES / deployment_stacks[0]), mode="deployment")]
    assert "Deployment" in kinds and "RayService" not in kinds


def test_the_moe_example_puts_each_replica_on_one_h200_and_sizes_every_expert():
    result = plan_from_files(EXAMPLES / "stack-moe-h200.yaml", EXAMPLES / "nodes.yaml")
    assert result.all_placed
    assert {p.node.rsplit("-", 1)[0] for p in result.pods if p.pod.gpus} == {"h200"}
    assert {r.replica.gpus for r in result.replicas} == {1}
    sized = {s.model: s.kv for s in result.sizing if s.kv is not None}
    assert "gpt-oss-120b" in {s.model for s in result.sizing}
    qwen = sized["qwen3-30b-a3b"]  # every expert resident: 30.5B parameters in bf16
    assert qwen.weights_bytes == 2 * SHAPES["qwen3-30b-a3b"].num_params() and qwen.max_seqs_at_max_len > 0
