"""A stack model's LoRA adapters in rendered manifests: the source (a PVC, a hostPath, or an image an init container
copies into an emptyDir) mounted in every pod that serves the model, the adapters loaded at start (--lora-modules,
or the serve config's args), validated against the real Kubernetes and KubeRay schemas; the planner counts their
device memory."""

from __future__ import annotations

import copy

import pytest
import yaml

from railyard.cluster.lora import volume_name
from railyard.cluster.render import render
from railyard.cluster.validate import validate_objects
from railyard.errors import ConfigError
from railyard.stack import parse_stack

from .conftest import ONE_GPU, TP2

ADAPTERS = [{"name": "sql", "path": "sql-r16"}, {"name": "chat", "path": "/opt/chat-r8"}]
SOURCES = {
    "pvc": {"persistent_volume_claim": "lora-adapters"},
    "host-path": {"host_path": "/mnt/adapters"},
    "image": {"image": "ghcr.io/example/adapters:1.0", "image_path": "/adapters", "size_limit": "2Gi"},
}


def _stack(base: dict, source: dict | None, **ingress):
    data = copy.deepcopy(base)
    data["models"][0]["lora"] = {"adapters": ADAPTERS, **({"source": source} if source else {})}
    data["models"][0]["engine"] = {"max_loras": 4, "max_lora_rank": 16}
    if ingress:
        data["ingress"] = ingress
    return parse_stack(data)


def _pods(objects: list[dict]) -> list[dict]:
    """Every pod template of the rendered objects."""
    out = []
    for obj in objects:
        if obj["kind"] == "Deployment":
            out.append(obj["spec"]["template"])
        elif obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            out += [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return out


@pytest.mark.parametrize("mode", ["deployment", "rayservice"])
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_adapter_source_renders_manifests_the_real_schemas_accept(mode, source):
    stack = _stack(ONE_GPU if mode == "deployment" else TP2, SOURCES[source])
    objects = render(stack, mode)
    assert validate_objects(objects, stack.kubernetes_version) == []
    for template in _pods(objects):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volume_name(stack.models[0].name) in volumes
        for container in template["spec"]["containers"]:
            mount = next(m for m in container["volumeMounts"] if m["name"] == volume_name(stack.models[0].name))
            assert mount == {"name": mount["name"], "mountPath": "/lora-adapters", "readOnly": True}


def test_an_image_source_is_copied_by_an_init_container_into_an_empty_dir_the_engine_reads():
    (dep, *_) = render(_stack(ONE_GPU, SOURCES["image"]), "deployment")
    spec = dep["spec"]["template"]["spec"]
    name = volume_name("qwen2-7b")
    assert {"name": name, "emptyDir": {"sizeLimit": "2Gi"}} in spec["volumes"]
    (copy_container,) = spec["initContainers"]
    assert copy_container["image"] == "ghcr.io/example/adapters:1.0"
    assert copy_container["command"] == ["cp", "-R", "/adapters/.", "/lora-adapters"]
    assert copy_container["volumeMounts"] == [{"name": name, "mountPath": "/lora-adapters"}]
    # it runs as the engine does: non-root, no privilege escalation
    assert copy_container["securityContext"] == spec["containers"][0]["securityContext"]


def test_a_pvc_source_is_mounted_read_only_and_a_host_path_must_be_a_directory():
    pvc = render(_stack(ONE_GPU, SOURCES["pvc"]), "deployment")[0]["spec"]["template"]["spec"]
    assert {"name": volume_name("qwen2-7b"),
            "persistentVolumeClaim": {"claimName": "lora-adapters", "readOnly": True}} in pvc["volumes"]
    host = render(_stack(ONE_GPU, SOURCES["host-path"]), "deployment")[0]["spec"]["template"]["spec"]
    assert {"name": volume_name("qwen2-7b"), "hostPath": {"path": "/mnt/adapters", "type": "Directory"}} \
        in host["volumes"]
    assert "initContainers" not in pvc and "initContainers" not in host


def test_a_single_engine_pod_loads_the_adapters_with_vllms_lora_modules_flag():
    (dep, *_) = render(_stack(ONE_GPU, SOURCES["pvc"], lora_runtime_updates=True), "deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    # relative paths resolve under the source's mount; absolute ones stay
    i = args.index("--lora-modules")
    assert args[i + 1:i + 3] == ["sql=/lora-adapters/sql-r16", "chat=/opt/chat-r8"]
    assert "--enable-lora" in args and "--enable-lora-runtime-updates" in args
    assert args[args.index("--max-loras") + 1] == "4"


def test_the_serve_config_carries_each_models_adapters_and_turns_lora_on():
    (service, *_) = render(_stack(TP2, SOURCES["image"]), "rayservice")
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    (model,) = app["args"]["models"]
    assert model["lora"] == {"adapters": [{"name": "sql", "path": "/lora-adapters/sql-r16"},
                                          {"name": "chat", "path": "/opt/chat-r8"}]}
    assert all(pool["engine"]["enable_lora"] and pool["engine"]["max_loras"] == 4 for pool in model["pools"])
    assert "lora_runtime_updates" not in app["args"]["ingress"]  # off unless the stack turns it on


def test_a_rayservice_mounts_the_adapters_on_the_head_too_where_an_ingress_may_check_them():
    (service, *_) = render(_stack(TP2, SOURCES["pvc"]), "rayservice")
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert any(v["name"] == volume_name("llama3-8b") for v in head["volumes"])


@pytest.mark.parametrize(("lora", "says"), [
    ({"adapters": ADAPTERS}, "relative paths"),
    ({"adapters": ADAPTERS, "source": {"persistent_volume_claim": "a", "image": "b"}}, "exactly one"),
    ({"adapters": ADAPTERS, "source": {}}, "exactly one"),
    ({"adapters": [ADAPTERS[0], ADAPTERS[0]], "source": SOURCES["pvc"]}, "unique"),
    ({"adapters": ADAPTERS, "source": {"host_path": "relative/dir"}}, "absolute"),
    ({"adapters": ADAPTERS, "source": {"persistent_volume_claim": "a", "size_limit": "2Gi"}}, "size_limit"),
    ({"adapters": ADAPTERS, "source": {"image": "b", "size_limit": "2GB"}}, "quantity"),
])
def test_a_bad_adapter_section_is_a_config_error_naming_the_problem(lora, says):
    data = copy.deepcopy(ONE_GPU)
    data["models"][0]["lora"] = lora
    with pytest.raises(ConfigError, match=says):
        parse_stack(data)


def test_the_planner_counts_the_adapter_slots_the_stack_asks_for():
    from railyard.cluster.plan import size_deployments

    def kv_bytes(engine: dict, lora: dict | None) -> tuple[int, int]:
        data = {"name": "s", "image": "ghcr.io/example/railyard:0.1.0", "gpu_product": "NVIDIA-H200",
                "models": [{"name": "qwen2-7b", "model": "/m", "shape": "qwen2-7b", "engine": engine,
                            **({"lora": lora} if lora else {})}]}
        (sizing,) = size_deployments(parse_stack(data), [], None, None)
        return sizing.kv.kv_cache_bytes, sizing.kv.per_gpu.lora_bytes

    base, no_slots = kv_bytes({}, None)
    with_loras, slots = kv_bytes({"max_loras": 8, "max_lora_rank": 16}, {"adapters": ADAPTERS[1:]})
    assert no_slots == 0 and slots > 0 and with_loras == base - slots
