"""What `cluster up` checks before it deploys, without Ray running: replicas' resource asks against the Ray
cluster's, the model directories, and the HAProxy template rewrite against the installed Ray's own template."""

from __future__ import annotations

import pytest

from railyard.errors import ConfigError
from railyard.serve.haproxy_local import loopback_config
from railyard.serve.launch import for_cpu
from railyard.serve.preflight import check_local_models, check_placement
from railyard.stack import parse_stack, to_serve_config


def _stack(model: str, **fields):
    return parse_stack({"image": "x", "models": [{"name": "m", "model": model, **fields}]})


def test_replicas_that_fit_pass_and_those_that_do_not_name_what_they_ask_and_what_ray_has(tiny_model):
    config = for_cpu(to_serve_config(_stack(tiny_model, num_replicas=3)))  # as deploy() checks it on a CPU Ray
    check_placement(config, {"CPU": 3.0})
    with pytest.raises(ConfigError, match=r"ask for \{CPU: 3\} \(engine-m-default: 3 x \{CPU: 1\}\), the Ray cluster "
                                          r"has \{CPU: 2\}"):
        check_placement(config, {"CPU": 2.0, "memory": 1e9})


def test_a_missing_model_directory_is_named_with_its_model(tmp_path):
    with pytest.raises(ConfigError, match=f"model 'm': model directory '{tmp_path / 'nope'}' does not exist"):
        check_local_models(_stack(str(tmp_path / "nope")))


def test_the_installed_rays_haproxy_template_gets_its_admin_binds_on_loopback():
    templates = pytest.importorskip("ray.serve._private.haproxy_templates")
    patched = loopback_config(templates.HAPROXY_CONFIG_TEMPLATE)
    assert patched is not None
    assert "bind 127.0.0.1:{{ config.stats_port }}" in patched and "bind 127.0.0.1:{{ config.metrics_port }}" in patched
    assert "bind *:" not in patched and "bind :" not in patched
