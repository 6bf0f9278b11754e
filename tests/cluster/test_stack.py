"""The stack file: validated once at the edge, and the single source of the Ray Serve config."""

from __future__ import annotations

import pytest
import yaml

from railyard.errors import ConfigError
from railyard.stack import load_stack, parse_stack, to_serve_config

from .conftest import EXAMPLES, ONE_GPU, TP2, TWO_MODELS, make_stack


@pytest.mark.parametrize("name", ["stack.yaml", "stack-tp2-two-models.yaml"])
def test_example_stacks_load(name):
    stack = load_stack(EXAMPLES / name)
    assert stack.models


def test_serve_config_is_a_standard_ray_serve_application():
    config = to_serve_config(make_stack(ONE_GPU))
    (app,) = config["applications"]
    assert app["name"] == "railyard"
    assert app["route_prefix"] == "/"
    assert app["import_path"] == "railyard.serve.app:build_app"
    assert [d["name"] for d in app["deployments"]] == ["engine-qwen2-7b-default"]


def test_one_gpu_replica_asks_ray_for_one_gpu_and_no_placement_group():
    (dep,) = to_serve_config(make_stack(ONE_GPU))["applications"][0]["deployments"]
    assert dep["ray_actor_options"]["num_gpus"] == 1
    assert dep["num_replicas"] == 2
    assert "placement_group_bundles" not in dep


def test_tensor_parallel_replica_takes_a_strict_pack_placement_group_of_tp_bundles():
    (dep,) = to_serve_config(make_stack(TP2))["applications"][0]["deployments"]
    assert dep["placement_group_bundles"] == [{"GPU": 1, "CPU": 1}, {"GPU": 1, "CPU": 1}]
    assert dep["placement_group_strategy"] == "STRICT_PACK"


def test_each_pool_is_its_own_deployment_with_the_pool_engine_options_over_the_model_ones():
    app = to_serve_config(make_stack(TWO_MODELS))["applications"][0]
    names = [d["name"] for d in app["deployments"]]
    assert names == ["engine-qwen2-7b-short", "engine-qwen2-7b-long", "engine-llama3-8b-default"]
    pools = app["args"]["models"][0]["pools"]
    assert pools[0] == {
        "name": "short",
        "max_prompt_tokens": 1024,
        "deployment": "engine-qwen2-7b-short",
        "engine": pools[0]["engine"],
    }
    assert pools[0]["engine"]["max_num_batched_tokens"] == 2048
    assert "max_num_batched_tokens" not in pools[1]["engine"]  # the pool sets nothing: the engine's own default


def test_autoscaling_maps_to_ray_autoscaling_config_on_pending_requests():
    dep = to_serve_config(make_stack(TWO_MODELS))["applications"][0]["deployments"][2]
    assert "num_replicas" not in dep
    assert dep["autoscaling_config"]["min_replicas"] == 1
    assert dep["autoscaling_config"]["max_replicas"] == 4
    assert dep["autoscaling_config"]["target_ongoing_requests"] == 8.0


def test_the_autoscaling_windows_pass_to_ray_with_the_stacks_defaults_or_its_own():
    stack = make_stack(TWO_MODELS)
    auto = to_serve_config(stack)["applications"][0]["deployments"][2]["autoscaling_config"]
    assert (auto["upscale_delay_s"], auto["downscale_delay_s"]) == (3.0, 600.0)
    assert (auto["look_back_period_s"], auto["metrics_interval_s"]) == (5.0, 1.0)
    stack.models[1].autoscaling = stack.models[1].autoscaling.model_copy(
        update={"look_back_period_s": 20.0, "metrics_interval_s": 2.0})
    auto = to_serve_config(stack)["applications"][0]["deployments"][2]["autoscaling_config"]
    assert (auto["look_back_period_s"], auto["metrics_interval_s"]) == (20, 2)
    with pytest.raises(ConfigError, match="look_back_period_s must be longer"):
        parse_stack({"image": "i", "models": [{"name": "m", "model": "/m", "autoscaling": {
            "max_replicas": 2, "look_back_period_s": 1}}]})


def test_max_ongoing_requests_lets_the_engine_batch_max_num_seqs():
    (dep,) = to_serve_config(make_stack(ONE_GPU))["applications"][0]["deployments"]
    assert dep["max_ongoing_requests"] == 256


def test_serve_config_args_are_plain_yaml_data():
    config = to_serve_config(make_stack(TWO_MODELS))
    assert yaml.safe_load(yaml.safe_dump(config)) == config


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Rail_Yard"}, "name"),
        ({"kubernetes_version": "latest"}, "kubernetes_version"),
        ({"models": []}, "models"),
        ({"models": [{"name": "m", "model": "/m", "tensor_parallel_size": 0}]}, "models.0.tensor_parallel_size"),
        ({"models": [{"name": "m", "model": "/m", "resources": {"memory": "64GB"}}]}, "models.0.resources.memory"),
        (
            {"models": [{"name": "m", "model": "/m", "engine": {"gpu_memory_utilization": 1.5}}]},
            "models.0.engine.gpu_memory_utilization",
        ),
        ({"policies": {"gpu_limts": False}}, "policies.gpu_limts"),
    ],
)
def test_a_bad_field_is_one_config_error_naming_it(change, field):
    data = dict(ONE_GPU, **change)
    with pytest.raises(ConfigError, match=rf"stack: {field}:"):
        parse_stack(data)


def test_num_replicas_and_autoscaling_together_are_rejected():
    model = {"name": "m", "model": "/m", "num_replicas": 2, "autoscaling": {"max_replicas": 3}}
    with pytest.raises(ConfigError, match="either num_replicas or autoscaling"):
        parse_stack(dict(ONE_GPU, models=[model]))


def test_only_the_last_pool_may_omit_its_prompt_limit():
    pools = [{"name": "any"}, {"name": "short", "max_prompt_tokens": 512}]
    with pytest.raises(ConfigError, match="only the last pool may omit"):
        parse_stack(dict(ONE_GPU, models=[{"name": "m", "model": "/m", "pools": pools}]))


def test_a_fractional_replica_asks_ray_for_its_share_of_a_gpu_with_its_kv_blocks():
    model = {"name": "m", "model": "/m", "num_replicas": 2, "gpu_fraction": 0.5, "engine": {"num_gpu_blocks": 4096}}
    app = to_serve_config(parse_stack(dict(ONE_GPU, models=[model])))["applications"][0]
    (dep,) = app["deployments"]
    assert dep["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.5}
    assert app["args"]["models"][0]["pools"][0]["engine"]["num_gpu_blocks"] == 4096


def test_a_fractional_replica_without_num_gpu_blocks_is_rejected():
    # Two engines profiling one GPU at once would each count the other's memory as used.
    model = {"name": "m", "model": "/m", "gpu_fraction": 0.5}
    with pytest.raises(ConfigError, match="gpu_fraction below 1 needs engine.num_gpu_blocks"):
        parse_stack(dict(ONE_GPU, models=[model]))
    pools = [{"name": "short", "max_prompt_tokens": 512, "engine": {"num_gpu_blocks": 64}}, {"name": "long"}]
    with pytest.raises(ConfigError, match="pools without it: long"):
        parse_stack(dict(ONE_GPU, models=[dict(model, pools=pools)]))


def test_a_fractional_replica_cannot_be_tensor_parallel():
    model = {"name": "m", "model": "/m", "gpu_fraction": 0.5, "tensor_parallel_size": 2,
             "engine": {"num_gpu_blocks": 64}}
    with pytest.raises(ConfigError, match="needs tensor_parallel_size 1"):
        parse_stack(dict(ONE_GPU, models=[model]))


def test_missing_stack_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_stack(tmp_path / "nope.yaml")


def test_a_tp_replica_needs_a_cpu_per_bundle():
    model = {"name": "m", "model": "/m", "tensor_parallel_size": 8, "resources": {"cpu": "4"}}
    with pytest.raises(ConfigError, match=r"resources.cpu \(4\) must be at least tensor_parallel_size \(8\)"):
        parse_stack(dict(ONE_GPU, models=[model]))


@pytest.mark.parametrize("name", ["stack.yaml", "stack-tp2-two-models.yaml"])
def test_ray_serve_accepts_the_serve_config(name):
    # Oracle: Ray Serve's own config-file schema (what `serve run` / serveConfigV2 are parsed with).
    schema = pytest.importorskip("ray.serve.schema")
    config = pytest.importorskip("ray.serve.config")
    parsed = schema.ServeDeploySchema.model_validate(to_serve_config(load_stack(EXAMPLES / name)))
    for deployment in parsed.applications[0].deployments:
        if isinstance(deployment.autoscaling_config, dict):
            config.AutoscalingConfig(**deployment.autoscaling_config)
    assert parsed.applications[0].import_path == "railyard.serve.app:build_app"


def test_a_pools_latency_knobs_reach_its_engine_args():
    pools = [{"name": "chat", "max_prompt_tokens": 2048,
              "engine": {"max_prefill_tokens_with_decodes": 192, "long_prefill_token_threshold": 512}},
             {"name": "batch"}]
    app = to_serve_config(parse_stack(dict(ONE_GPU, models=[{"name": "m", "model": "/m", "pools": pools}])))
    chat, batch = app["applications"][0]["args"]["models"][0]["pools"]
    assert chat["engine"]["max_prefill_tokens_with_decodes"] == 192
    assert chat["engine"]["long_prefill_token_threshold"] == 512
    assert "max_prefill_tokens_with_decodes" not in batch["engine"]  # the engine's default: off


def test_a_models_fp8_gemm_reaches_its_engine_args_and_a_wrong_one_is_refused():
    model = {"name": "m", "model": "/m", "engine": {"quantization": "fp8", "fp8_gemm": "rowwise"}}
    app = to_serve_config(parse_stack(dict(ONE_GPU, models=[model])))
    engine = app["applications"][0]["args"]["models"][0]["engine"]
    assert engine["fp8_gemm"] == "rowwise"
    with pytest.raises(ConfigError, match="fp8_gemm"):
        parse_stack(dict(ONE_GPU, models=[dict(model, engine={"fp8_gemm": "cutlass"})]))
