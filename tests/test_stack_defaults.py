"""One set of defaults: a stack file that names only its model, the same model in plain Ray Serve args (no stack
file), the RayService and the single-engine Deployment `railyard deploy render` writes, and `railyard serve` with no
engine flags give the same engine, autoscaling and replica options (Ray Serve's own DeploymentConfig is the judge of
what a deployment gets); the planner predicts with the engine's own defaults."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

pytest.importorskip("ray")

from railyard.cli import build_parser, main  # noqa: E402
from railyard.cluster.plan import engine_limits  # noqa: E402
from railyard.engine.args import engine_config_from_args  # noqa: E402
from railyard.engine.config import EngineConfig  # noqa: E402
from railyard.model.spec import read_model_spec  # noqa: E402
from railyard.serve.app import engine_deployment  # noqa: E402
from railyard.serve.spec import parse_app_args  # noqa: E402
from railyard.stack import ENGINE_DEFAULTS, load_stack, resolved_engine, to_serve_config  # noqa: E402

NAME = "tiny"


def _render(stack_file, mode: str, capsys) -> list[dict]:
    assert main(["deploy", "render", "-c", str(stack_file), "--mode", mode]) == 0
    return [doc for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]


def _serve_engine(argv: list[str]) -> EngineConfig:
    """The EngineConfig `railyard serve ARGV` starts its engine with."""
    args = build_parser().parse_args(argv)
    return engine_config_from_args(args, served_model_name=args.served_model_name)


def _deployment_options(spec, entry: dict | None = None) -> dict:
    """What Ray Serve applies to the app's engine deployment: the options build_app sets in code, overridden by
    the config file's deployment entry where there is one (as `serve run` and a RayService do)."""
    model = spec.models[0]
    deployment = engine_deployment(spec, model, model.pools[0])
    if entry is not None:
        deployment = deployment.options(**{k: v for k, v in entry.items() if k != "name"})
    options = deployment._deployment_config.model_dump()
    # which options code and which the config file set is Serve's bookkeeping, not what the replicas run with
    options.pop("user_configured_option_names")
    options["ray_actor_options"] = deployment.ray_actor_options
    return options


@pytest.fixture
def stack_file(tiny_model, tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text(f"image: railyard:test\nmode: deployment\nmodels:\n  - name: {NAME}\n    model: {tiny_model}\n"
                    "    autoscaling: {max_replicas: 2}\n")
    return path


def test_cluster_up_with_and_without_a_stack_file_the_rendered_manifests_and_serve_agree_on_every_default(
        tiny_model, stack_file, tmp_path, capsys):
    # `railyard cluster up -c stack.yaml` (and `railyard serve --config`) deploy to_serve_config(load_stack(...)).
    with_stack = to_serve_config(load_stack(stack_file))
    (app,) = with_stack["applications"]
    # The RayService embeds that config unchanged.
    (service,) = [o for o in _render(stack_file, "rayservice", capsys) if o["kind"] == "RayService"]
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == with_stack
    # Without a stack file: the same model in the serve app's plain args (a hand-written Ray Serve config).
    plain = parse_app_args({"models": [{"name": NAME, "model": tiny_model, "autoscaling": {"max_replicas": 2}}]})
    stacked = parse_app_args(app["args"])

    # Each replica's engine, the single-engine pod's `railyard serve` flags, and `railyard serve` alone.
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(stack_file.read_text().replace("    autoscaling: {max_replicas: 2}\n", ""))
    (pod_deployment,) = [o for o in _render(fixed, "deployment", capsys) if o["kind"] == "Deployment"]
    pod_args = pod_deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    engines = {
        "cluster up with a stack file": EngineConfig(**stacked.models[0].pools[0].engine),
        "cluster up without a stack file": EngineConfig(**plain.models[0].pools[0].engine),
        "deploy render (deployment mode)": _serve_engine(pod_args),
        "railyard serve": _serve_engine(["serve", "--model", tiny_model, "--served-model-name", NAME]),
    }
    for where, engine in engines.items():
        assert dataclasses.asdict(engine) == dataclasses.asdict(engines["railyard serve"]), where

    # Autoscaling, health checks, draining, admission: what Ray Serve applies to the engine deployment.
    assert _deployment_options(stacked, app["deployments"][0]) == _deployment_options(plain)
    assert stacked.max_waiting_requests == plain.max_waiting_requests == build_parser().parse_args(
        ["serve"]).max_waiting_requests
    assert (stacked.models[0].stream_interval_s, stacked.models[0].stream_items_per_s) == (
        plain.models[0].stream_interval_s, plain.models[0].stream_items_per_s)
    assert stacked.ingress_replicas == plain.ingress_replicas


def test_the_planner_predicts_with_the_engines_own_defaults(tiny_model, stack_file):
    model = load_stack(stack_file).models[0]
    predicted = resolved_engine(model)
    predicted.update(engine_limits(predicted, read_model_spec(tiny_model)))
    engine = EngineConfig(model=tiny_model)
    assert {k: getattr(engine, k) for k in ENGINE_DEFAULTS} == {k: ENGINE_DEFAULTS[k] for k in ENGINE_DEFAULTS}
    engine.resolve(read_model_spec(tiny_model).max_position_embeddings)
    assert {k: getattr(engine, k) for k in ENGINE_DEFAULTS} == {k: predicted[k] for k in ENGINE_DEFAULTS}
