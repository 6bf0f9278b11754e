"""Every example stack renders in its own mode into manifests the Kubernetes and KubeRay schemas accept,
and one shows the plain-Deployment mode (one engine, no Ray)."""

from __future__ import annotations

import pytest

from railyard.cluster.render import render
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
