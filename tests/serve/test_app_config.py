"""The serve app's configuration: the stack's Ray Serve config parses, validates as Ray's own schema,
and turns into deployments with our router, policy and placement (no Ray cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from ray.serve.schema import ServeDeploySchema

from railyard.errors import ConfigError
from railyard.serve.app import autoscaling_config, build_app, replica_resources, standby_options
from railyard.serve.autoscaling import POLICIES, POLICY_IMPORT_PATH
from railyard.serve.launch import for_cpu, with_autoscaling_policy, with_pending_policy, with_router
from railyard.serve.spec import (
    DEFAULT_INGRESS_REPLICAS, DEFAULT_STREAM_INTERVAL_S, DEFAULT_STREAM_ITEMS_PER_S, parse_app_args)
from railyard.stack import parse_stack, to_serve_config


def _stack(model_dir: str):
    return parse_stack({"name": "cfg", "image": "railyard:test", "models": [
        {"name": "chat", "model": model_dir, "tensor_parallel_size": 2,
         "autoscaling": {"min_replicas": 1, "max_replicas": 4, "target_pending_per_replica": 8},
         "engine": {"max_model_len": 1024},
         "pools": [{"name": "short", "max_prompt_tokens": 512, "engine": {"max_num_batched_tokens": 2048}},
                   {"name": "long", "engine": {"max_num_batched_tokens": 8192}}]},
        {"name": "small", "model": model_dir, "num_replicas": 2, "engine": {"max_model_len": 1024}},
    ]})


def test_the_stacks_args_become_one_deployment_per_model_and_pool(tiny_model):
    config = to_serve_config(_stack(tiny_model))
    app = config["applications"][0]
    spec = parse_app_args(app["args"])
    assert spec.deployments() == [d["name"] for d in app["deployments"]]
    chat = spec.models[0]
    assert [(p.name, p.max_prompt_tokens) for p in chat.pools] == [("short", 512), ("long", None)]
    assert chat.pools[0].engine["max_num_batched_tokens"] == 2048
    assert chat.pools[1].engine["max_num_batched_tokens"] == 8192
    # replica counts and autoscaling are the deployments' options, not the replicas' code
    assert all(p.autoscaling is None and p.standby is None for p in chat.pools)
    assert all(d["autoscaling_config"]["target_ongoing_requests"] == 8 for d in app["deployments"][:2])


def _code_version(stack) -> str:
    """Ray Serve's code version of the stack's app: a change redeploys every replica, else it updates in place."""
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    return get_app_code_version(ServeApplicationSchema.model_validate(to_serve_config(stack)["applications"][0]))


def test_autoscaling_edits_update_the_running_replicas_and_engine_edits_restart_them(tiny_model):
    stack = _stack(tiny_model)
    before = _code_version(stack)
    auto = stack.models[0].autoscaling
    auto.min_replicas, auto.max_replicas, auto.upscale_delay_s, auto.target_pending_per_replica = 2, 6, 1.0, 16
    stack.models[1].num_replicas = 3
    assert _code_version(stack) == before
    stack.models[1].engine.max_model_len = 512
    assert _code_version(stack) != before


def test_standby_engines_reach_each_pools_replicas_with_the_max_replicas_that_bounds_them(tiny_model):
    stack = parse_stack({"name": "cfg", "image": "railyard:test", "models": [
        {"name": "chat", "model": tiny_model, "engine": {"max_model_len": 1024},
         "autoscaling": {"min_replicas": 1, "max_replicas": 2, "standby_engines": 1},
         "pools": [{"name": "short", "max_prompt_tokens": 512},
                   {"name": "long", "autoscaling": {"min_replicas": 1, "max_replicas": 3, "standby_engines": 2}}]},
        {"name": "small", "model": tiny_model, "autoscaling": {"min_replicas": 1, "max_replicas": 4}}]})
    args = to_serve_config(stack)["applications"][0]["args"]
    assert [p.get("standby") for m in args["models"] for p in m["pools"]] == [
        {"engines": 1, "max_replicas": 2}, {"engines": 2, "max_replicas": 3}, None]
    spec = parse_app_args(args)
    assert [standby_options(p) for m in spec.models for p in m.pools] == [
        {"standby_engines": 1, "standby_max_replicas": 2}, {"standby_engines": 2, "standby_max_replicas": 3}, {}]
    # without a stack file, a pool's autoscaling says the same
    bare = parse_app_args({"models": [{"name": "m", "model": tiny_model,
                                       "autoscaling": {"max_replicas": 2, "standby_engines": 1}}]})
    assert standby_options(bare.models[0].pools[0]) == {"standby_engines": 1, "standby_max_replicas": 2}
    with pytest.raises(ConfigError, match=r"pools\[0\].standby must be"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "pools": [
            {"name": "p", "standby": {"engines": 1}}]}]})
    with pytest.raises(ConfigError, match=r"pools\[0\].standby.standby_engines"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "pools": [
            {"name": "p", "standby": {"engines": 9, "max_replicas": 2}}]}]})


def test_replicas_that_share_a_gpu_and_may_scale_up_keep_one_standby_engine_unless_told_otherwise(tiny_model):
    def standby(model: dict) -> list:
        stack = parse_stack({"name": "cfg", "image": "railyard:test", "models": [
            {"name": "chat", "model": tiny_model, "engine": {"num_gpu_blocks": 64}, **model}]})
        args = to_serve_config(stack)["applications"][0]["args"]
        assert [standby_options(p) for m in parse_app_args(args).models for p in m.pools] == \
            [({"standby_engines": p["standby"]["engines"], "standby_max_replicas": p["standby"]["max_replicas"]}
              if "standby" in p else {}) for m in args["models"] for p in m["pools"]]
        return [p.get("standby") for m in args["models"] for p in m["pools"]]

    burst = {"min_replicas": 1, "max_replicas": 2}
    assert standby({"gpu_fraction": 0.5, "autoscaling": burst}) == [{"engines": 1, "max_replicas": 2}]
    # a whole GPU per replica: a standby would take a GPU no replica of the deployment holds
    assert standby({"autoscaling": burst}) == [None]
    # no scaling up: nothing to wake
    assert standby({"gpu_fraction": 0.5, "autoscaling": {"min_replicas": 2, "max_replicas": 2}}) == [None]
    assert standby({"gpu_fraction": 0.5, "num_replicas": 2}) == [None]
    # the user's word wins either way
    assert standby({"gpu_fraction": 0.5, "autoscaling": {**burst, "standby_engines": 0}}) == [None]
    assert standby({"autoscaling": {**burst, "standby_engines": 2}}) == [{"engines": 2, "max_replicas": 2}]
    # without a stack file the share comes from the pool's ray_actor_options (a whole GPU without them)
    bare = {"name": "m", "model": tiny_model, "autoscaling": burst}
    shared = parse_app_args({"models": [{**bare, "pools": [
        {"name": "p", "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.5}}]}]})
    assert standby_options(shared.models[0].pools[0]) == {"standby_engines": 1, "standby_max_replicas": 2}
    assert standby_options(parse_app_args({"models": [bare]}).models[0].pools[0]) == {}
    with pytest.raises(ConfigError, match=r"pools\[0\].ray_actor_options.num_gpus must be a number, got 'half'"):
        parse_app_args({"models": [{**bare, "pools": [{"name": "p", "ray_actor_options": {"num_gpus": "half"}}]}]})
    with pytest.raises(ConfigError, match=r"pools\[0\].standby must be"):  # a stack writes the resolved count
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "pools": [
            {"name": "p", "standby": {"engines": None, "max_replicas": 2}}]}]})


def test_a_models_stream_interval_reaches_its_replicas_and_defaults_to_ray_serve_llms_50_ms(tiny_model):
    stack = _stack(tiny_model)
    stack.models[1].stream_interval_s = 0.2
    spec = parse_app_args(to_serve_config(stack)["applications"][0]["args"])
    assert [m.stream_interval_s for m in spec.models] == [DEFAULT_STREAM_INTERVAL_S, 0.2]
    assert DEFAULT_STREAM_INTERVAL_S == 0.05
    with pytest.raises(ConfigError, match=r"models\[0\].stream_interval_s"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "stream_interval_s": -1}]})


def test_a_models_stream_items_budget_reaches_its_replicas_and_defaults_to_500_per_replica(tiny_model):
    stack = _stack(tiny_model)
    stack.models[1].stream_items_per_s = 0.0  # the fixed interval only (the setting before the budget)
    spec = parse_app_args(to_serve_config(stack)["applications"][0]["args"])
    assert [m.stream_items_per_s for m in spec.models] == [DEFAULT_STREAM_ITEMS_PER_S, 0.0]
    assert DEFAULT_STREAM_ITEMS_PER_S == 500.0
    with pytest.raises(ConfigError, match=r"models\[0\].stream_items_per_s"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "stream_items_per_s": -1}]})


def test_the_stack_deploys_one_ingress_replica_by_default_and_the_number_it_sets(tiny_model):
    stack = _stack(tiny_model)
    args = to_serve_config(stack)["applications"][0]["args"]
    assert args["ingress"] == {"num_replicas": 1} and DEFAULT_INGRESS_REPLICAS == 1
    ingress = build_app(args)._bound_deployment  # what Serve deploys in front of the engines
    assert (ingress.name, ingress.num_replicas, ingress.ray_actor_options) == ("openai-ingress", 1, {"num_cpus": 0})
    stack.ingress.num_replicas = 4
    assert build_app(to_serve_config(stack)["applications"][0]["args"])._bound_deployment.num_replicas == 4
    assert parse_app_args({"models": [{"name": "m", "model": tiny_model}]}).ingress_replicas == DEFAULT_INGRESS_REPLICAS
    with pytest.raises(ConfigError, match="ingress.num_replicas"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model}], "ingress": {"num_replicas": 0}})


def test_bad_args_are_config_errors_that_name_the_field(tiny_model):
    with pytest.raises(ConfigError, match="models"):
        parse_app_args({})
    with pytest.raises(ConfigError, match=r"models\[0\].pools\[0\].engine: unknown option\(s\) max_seqs"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "pools": [
            {"name": "p", "engine": {"max_seqs": 4}}]}]})
    with pytest.raises(ConfigError, match="only the last pool"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "pools": [{"name": "a"}, {"name": "b"}]}]})
    with pytest.raises(ConfigError, match="router.name"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model}], "router": {"name": "random"}})
    with pytest.raises(ConfigError, match="block_size"):
        parse_app_args({"models": [{"name": "m", "model": tiny_model, "engine": {"block_size": 7}}]})


def test_a_tensor_parallel_replica_asks_for_strict_pack_bundles(tiny_model):
    spec = parse_app_args(to_serve_config(_stack(tiny_model))["applications"][0]["args"])
    chat = spec.models[0]
    gpu = replica_resources(chat, chat.pools[0])
    assert gpu["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert gpu["placement_group_bundles"] == [{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}]
    assert gpu["placement_group_strategy"] == "STRICT_PACK"
    cpu_spec = parse_app_args(for_cpu(to_serve_config(_stack(tiny_model)))["applications"][0]["args"])
    cpu = replica_resources(cpu_spec.models[0], cpu_spec.models[0].pools[0])
    assert cpu["ray_actor_options"]["num_gpus"] == 0
    assert cpu["placement_group_bundles"] == [{"CPU": 1}, {"CPU": 1}]


def test_autoscaling_set_in_code_runs_the_pending_requests_policy_with_its_thresholds(tiny_model):
    spec = parse_app_args({"models": [{"name": "m", "model": tiny_model, "autoscaling": {
        "min_replicas": 1, "max_replicas": 4, "target_pending_per_replica": 8}}]})
    config = autoscaling_config(spec.models[0].pools[0])
    assert config.policy.policy_function == POLICY_IMPORT_PATH
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 4, 8)


def test_the_launched_config_is_a_valid_ray_serve_config_with_our_policy_router_and_cpu_engines(tiny_model):
    config = with_router(for_cpu(with_pending_policy(to_serve_config(_stack(tiny_model)))), "round_robin")
    ServeDeploySchema.model_validate(config)
    app = config["applications"][0]
    autoscaled = [d for d in app["deployments"] if "autoscaling_config" in d]
    assert autoscaled and all(d["autoscaling_config"]["policy"]["policy_function"] == POLICY_IMPORT_PATH
                              for d in autoscaled)
    assert all(d["ray_actor_options"]["num_gpus"] == 0 for d in app["deployments"])
    assert all(p["engine"]["device"] == "cpu" for m in app["args"]["models"] for p in m["pools"])
    assert app["args"]["router"]["name"] == "round_robin"


def test_the_baseline_autoscaling_policy_is_rays_default_with_the_same_bounds_and_delays(tiny_model):
    ours = to_serve_config(_stack(tiny_model))
    baseline = with_autoscaling_policy(ours, "ray_default")
    ServeDeploySchema.model_validate(baseline)
    for mine, theirs in zip(ours["applications"][0]["deployments"], baseline["applications"][0]["deployments"]):
        if "autoscaling_config" not in mine:
            assert "autoscaling_config" not in theirs  # a fixed replica count stays fixed
            continue
        assert theirs["autoscaling_config"]["policy"]["policy_function"] == POLICIES["ray_default"]
        assert ({k: v for k, v in theirs["autoscaling_config"].items() if k != "policy"}
                == {k: v for k, v in mine["autoscaling_config"].items() if k != "policy"})
    with pytest.raises(ConfigError, match="autoscaling policy must be one of"):
        with_autoscaling_policy(ours, "gpu_utilisation")


def test_a_named_shape_is_served_with_its_vocabulary_and_the_embedded_tokenizer(tiny_model):
    # A shape (random weights, GPU benchmarks) has no checkpoint: its replicas speak the embedded model's
    # byte-level tokenizer, as `railyard serve --model qwen3-0.6b` does.
    from railyard.engine.tokenizer import with_shape_tokenizer
    from railyard.engine.config import EngineConfig
    from railyard.engine.startup.tiny_model import ensure_tiny_model
    from railyard.serve.ingress import make_clients
    from railyard.shapes import shape_config

    routes = [{"name": "q", "model": "qwen3-0.6b",
               "pools": [{"name": "default", "deployment": "engine-q-default", "max_prompt_tokens": None,
                          "max_model_len": 4096, "tokenizer": None}]}]
    (client,) = make_clients(routes, {"engine-q-default": "a deployment handle"}).values()
    assert client.vocab_size == shape_config("qwen3-0.6b")["vocab_size"]
    assert client.max_model_len == 4096
    assert client.model_info.tokenizer == str(ensure_tiny_model())
    config = EngineConfig(model="qwen3-0.6b")
    assert with_shape_tokenizer(config) and config.tokenizer == str(ensure_tiny_model())
    checkpoint = EngineConfig(model=str(tiny_model))
    assert not with_shape_tokenizer(checkpoint) and checkpoint.tokenizer is None


def test_the_chat_parsers_a_model_names_reach_its_front(tiny_model):
    from railyard.serve.app import _routes
    from railyard.serve.ingress import make_clients

    stack = parse_stack({"name": "cfg", "image": "railyard:test", "models": [
        {"name": "chat", "model": tiny_model},
        {"name": "small", "model": tiny_model, "engine": {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}}]})
    spec = parse_app_args(to_serve_config(stack)["applications"][0]["args"])
    clients = make_clients(_routes(spec), {p.deployment: "a deployment handle" for m in spec.models for p in m.pools})
    assert (clients["small"].model_info.reasoning_parser, clients["small"].model_info.tool_call_parser) == \
        ("qwen3", "hermes")
    assert clients["chat"].model_info.reasoning_parser == "auto"
