"""Rendered manifests pass the real schemas, for every stack shape and with each policy on or off.

Oracles: kubernetes-validate (Kubernetes' own OpenAPI schemas, strict) for core objects, and the
vendored KubeRay/VPA CRD schemas (referencing those same Kubernetes definitions) for custom resources.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from railyard.cluster.render import render, to_yaml
from railyard.cluster.validate import validate_object
from railyard.errors import ConfigError
from railyard.stack import to_serve_config

from .conftest import ONE_GPU, STACKS, TP2, make_stack

POLICIES_ON_BY_DEFAULT = [
    "gpu_limits",
    "gpu_toleration",
    "gpu_node_affinity",
    "probes",
    "pdb",
    "resources",
    "shm",
    "security_context",
    "prometheus",
]


def _assert_valid(objects, version="1.30"):
    for obj in objects:
        if obj["apiVersion"] in ("ray.io/v1", "autoscaling.k8s.io/v1"):
            assert validate_object(obj, version) == []
        else:
            kubernetes_validate.validate(obj, version, strict=True)  # raises on any schema error


def _pods(objects):
    """Every pod template in the rendered objects."""
    out = []
    for obj in objects:
        if obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            out.append(cluster["headGroupSpec"]["template"])
            out += [g["template"] for g in cluster["workerGroupSpecs"]]
        elif obj["kind"] == "Deployment":
            out.append(obj["spec"]["template"])
    return out


def _gpu_pods(objects):
    return [p for p in _pods(objects) if "nvidia.com/gpu" in str(p)]


@pytest.mark.parametrize("version", ["1.25", "1.30", "1.33"])
def test_every_stack_renders_valid_rayservice_manifests(any_stack, version):
    _assert_valid(render(any_stack, "rayservice"), version)


@pytest.mark.parametrize("name", ["one-gpu", "tp2"])
def test_single_engine_stacks_render_valid_deployment_manifests(name):
    objects = render(make_stack(STACKS[name]), "deployment")
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "PodDisruptionBudget"]
    _assert_valid(objects)


@pytest.mark.parametrize("policy", POLICIES_ON_BY_DEFAULT)
@pytest.mark.parametrize("mode", ["rayservice", "deployment"])
def test_manifests_stay_valid_with_each_policy_switched_off(policy, mode):
    stack = make_stack(ONE_GPU, policies={policy: False})
    _assert_valid(render(stack, mode))


@pytest.mark.parametrize("spread", ["off", "preferred", "required"])
def test_manifests_stay_valid_with_each_spread_mode(spread):
    _assert_valid(render(make_stack(TP2, policies={"spread": spread}), "rayservice"))


def test_vpa_is_valid_and_limited_to_cpu_and_memory_without_evicting_gpu_replicas():
    objects = render(make_stack(ONE_GPU, policies={"vpa": True}), "deployment")
    _assert_valid(objects)
    (vpa,) = [o for o in objects if o["kind"] == "VerticalPodAutoscaler"]
    (policy,) = vpa["spec"]["resourcePolicy"]["containerPolicies"]
    assert policy["controlledResources"] == ["cpu", "memory"]
    assert vpa["spec"]["updatePolicy"]["updateMode"] == "Initial"
    assert vpa["spec"]["targetRef"]["name"] == objects[0]["metadata"]["name"]


def test_vpa_with_a_rayservice_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="VPA cannot target"):
        render(make_stack(ONE_GPU, policies={"vpa": True}), "rayservice")


def test_rayservice_serve_config_is_the_same_config_layer_2_runs():
    stack = make_stack(STACKS["two-models"])
    (service, *_) = render(stack, "rayservice")
    assert service["apiVersion"] == "ray.io/v1"
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == to_serve_config(stack)


def _comment_above(lines: list[str], option: str) -> str:
    """The comment block right above the first line that sets `option`, as one line of text."""
    (first, *_) = [i for i, line in enumerate(lines) if line.strip().startswith(f"{option}:")]
    comment: list[str] = []
    for line in reversed(lines[:first]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("# "))
    return " ".join(comment)


def test_the_settings_that_decide_a_burst_are_in_the_serve_config_each_under_its_reason():
    stack = make_stack(STACKS["two-models"])  # llama3-8b autoscales
    (service, *_) = render(stack, "rayservice")
    lines = service["spec"]["serveConfigV2"].splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.strip() == "deployments:"):]  # Ray's options
    for option, reason in (("upscale_delay_s", "burst gets its replica"), ("health_check_period_s", "dead engine"),
                           ("graceful_shutdown_timeout_s", "in-flight generations")):
        assert reason in _comment_above(lines, option), option
    deployment = to_serve_config(stack)["applications"][0]["deployments"][0]
    assert (deployment["health_check_period_s"], deployment["graceful_shutdown_timeout_s"]) == (5.0, 300.0)


def test_the_streaming_settings_are_in_the_serve_config_each_under_its_reason():
    stack = make_stack(ONE_GPU, models=[{**ONE_GPU["models"][0], "stream_items_per_s": 250}])
    (service, *_) = render(stack, "rayservice")
    lines = service["spec"]["serveConfigV2"].splitlines()
    for option, reason in (("ingress", "HTTP proxy spreads requests over"), ("stream_items_per_s", "live streams")):
        assert reason in _comment_above(lines, option), option
    args = to_serve_config(stack)["applications"][0]["args"]
    assert (args["ingress"], args["models"][0]["stream_items_per_s"]) == ({"num_replicas": 1}, 250)


def test_the_standby_engines_of_shared_gpu_replicas_are_in_the_serve_config_under_their_reason():
    model = {"name": "m", "model": "/m", "gpu_fraction": 0.5, "engine": {"num_gpu_blocks": 64},
             "autoscaling": {"min_replicas": 1, "max_replicas": 3}}
    stack = make_stack(ONE_GPU, models=[model])
    (service, *_) = render(stack, "rayservice")
    lines = service["spec"]["serveConfigV2"].splitlines()
    assert "wakes one instead of starting an engine process" in _comment_above(lines, "standby")
    ((pool,),) = [m["pools"] for m in to_serve_config(stack)["applications"][0]["args"]["models"]]
    assert pool["standby"] == {"engines": 1, "max_replicas": 3}


def test_a_worker_pod_outlives_its_replicas_graceful_shutdown():
    stack = make_stack(ONE_GPU, models=[{**ONE_GPU["models"][0], "lifecycle": {"graceful_shutdown_timeout_s": 900}}])
    (service, *_) = render(stack, "rayservice")
    (group,) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["template"]["spec"]["terminationGracePeriodSeconds"] > 900
    assert to_serve_config(stack)["applications"][0]["deployments"][0]["graceful_shutdown_timeout_s"] == 900


def test_one_worker_group_per_deployment_sized_for_one_replica():
    (service, *_) = render(make_stack(STACKS["two-models"]), "rayservice")
    groups = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == [
        "engine-qwen2-7b-short",
        "engine-qwen2-7b-long",
        "engine-llama3-8b-default",
    ]
    tp2 = groups[2]
    assert (tp2["minReplicas"], tp2["replicas"], tp2["maxReplicas"]) == (1, 1, 4)
    limits = tp2["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2  # the whole STRICT_PACK group in one pod, hence one node
    assert service["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True


def test_head_takes_no_gpus_and_no_gpu_scheduling_policies():
    (service, *_) = render(make_stack(ONE_GPU), "rayservice")
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert "nvidia.com/gpu" not in str(head["template"])


def test_gpu_pods_get_gpu_limits_toleration_and_gfd_affinity():
    for template in _gpu_pods(render(make_stack(TP2), "rayservice")):
        spec = template["spec"]
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"] == [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]},
            {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]},
        ]


@pytest.mark.parametrize(
    ("policy", "marker"),
    [
        ("gpu_limits", "'nvidia.com/gpu': 1"),
        ("gpu_toleration", "tolerations"),
        ("gpu_node_affinity", "nodeAffinity"),
        ("probes", "readinessProbe"),
        ("resources", "'requests'"),
        ("shm", "/dev/shm"),
        ("security_context", "allowPrivilegeEscalation"),
        ("prometheus", "prometheus.io/scrape"),
    ],
)
def test_switching_a_policy_off_removes_exactly_its_fields(policy, marker):
    on = render(make_stack(ONE_GPU), "deployment")
    off = render(make_stack(ONE_GPU, policies={policy: False}), "deployment")
    assert marker in str(on[0])
    assert marker not in str(off[0])


def test_pdb_policy_adds_one_budget_per_worker_group():
    on = render(make_stack(STACKS["two-models"]), "rayservice")
    off = render(make_stack(STACKS["two-models"], policies={"pdb": False}), "rayservice")
    assert [o["kind"] for o in on].count("PodDisruptionBudget") == 3
    assert [o["kind"] for o in off] == ["RayService"]


def test_spread_preferred_is_soft_and_required_is_hard_anti_affinity():
    soft = _gpu_pods(render(make_stack(ONE_GPU), "deployment"))[0]["spec"]["affinity"]["podAntiAffinity"]
    hard = _gpu_pods(render(make_stack(ONE_GPU, policies={"spread": "required"}), "deployment"))[0]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in soft
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["spec"]["affinity"]["podAntiAffinity"]


def test_probes_hit_health_on_the_single_engine():
    container = _gpu_pods(render(make_stack(ONE_GPU), "deployment"))[0]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_requests_equal_limits_for_guaranteed_qos():
    resources = _gpu_pods(render(make_stack(ONE_GPU), "deployment"))[0]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_deployment_mode_refuses_several_models():
    with pytest.raises(ConfigError, match="deployment mode runs one engine"):
        render(make_stack(STACKS["two-models"]), "deployment")


def test_yaml_output_round_trips_to_the_same_objects():
    objects = render(make_stack(STACKS["two-models"]), "rayservice")
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


def test_a_fractional_gpu_stack_renders_whole_gpu_pods_that_the_planner_counts_whole():
    from railyard.cluster.workload import replicas_from_objects

    model = {"name": "m", "model": "/m", "num_replicas": 2, "gpu_fraction": 0.5, "engine": {"num_gpu_blocks": 64}}
    objects = render(make_stack(ONE_GPU, models=[model]), "rayservice")
    _assert_valid(objects)
    (pod,) = _gpu_pods(objects)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert [r.gpus for r in replicas_from_objects(objects)] == [1, 1]


def _worker_containers(objects):
    return [c for pod in _gpu_pods(objects) for c in pod["spec"]["containers"]]


def test_replicas_sharing_a_gpu_start_an_mps_daemon_before_ray_with_the_reason_on_the_pod():
    model = {"name": "m", "model": "/m", "num_replicas": 2, "gpu_fraction": 0.5, "engine": {"num_gpu_blocks": 64}}
    objects = render(make_stack(ONE_GPU, models=[model]), "rayservice")
    _assert_valid(objects)
    (pod,) = _gpu_pods(objects)
    (container,) = pod["spec"]["containers"]
    assert "nvidia-cuda-mps-control -d" in container["command"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) == {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "RAY_SERVE_ENABLE_HA_PROXY",
                        "RAILYARD_CACHE"}
    assert "at the same time" in pod["metadata"]["annotations"]["railyard.io/gpu-sharing"]


@pytest.mark.parametrize("model", [
    {"name": "m", "model": "/m", "num_replicas": 2, "gpu_fraction": 0.5, "gpu_sharing": "time-slicing",
     "engine": {"num_gpu_blocks": 64}},
    {"name": "m", "model": "/m", "num_replicas": 2},  # whole-GPU replicas share nothing
], ids=["time-slicing", "whole GPUs"])
def test_no_mps_daemon_where_replicas_do_not_share_a_gpu_by_mps(model):
    objects = render(make_stack(ONE_GPU, models=[model]), "rayservice")
    (container,) = _worker_containers(objects)
    assert "command" not in container
    assert [e["name"] for e in container["env"]] == ["RAY_SERVE_ENABLE_HA_PROXY", "RAILYARD_CACHE"]


@pytest.mark.parametrize(("proxy", "value"), [(None, "1"), ("haproxy", "1"), ("ray", "0")])
def test_every_ray_pod_runs_the_stacks_serve_proxy_with_the_reason_on_the_head(proxy, value):
    """Serve reads its proxy choice from each Ray process's environment: the head (controller, proxies) and
    every worker (replicas serving the proxy's HTTP) must agree; haproxy is the default."""
    ingress = {"proxy": proxy} if proxy else {}
    objects = render(make_stack(ONE_GPU, ingress=ingress), "rayservice")
    _assert_valid(objects)
    (service,) = [o for o in objects if o["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]
    pods = [head] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert {"name": "RAY_SERVE_ENABLE_HA_PROXY", "value": value} in container["env"]
    assert "HAProxy" in head["metadata"]["annotations"]["railyard.io/serve-proxy"]
    assert "proxy" not in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]["args"]["ingress"]


def test_the_mps_start_lets_ray_start_where_the_daemon_is_missing(tmp_path):
    """KubeRay runs `<command> && ray start ...`: without nvidia-cuda-mps-control the command still exits 0."""
    import subprocess

    from railyard.cluster.pod import MPS_START

    script = MPS_START.replace("/tmp/nvidia-mps", str(tmp_path / "nvidia-mps")) + " && echo ray-start"
    done = subprocess.run(["/bin/bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "ray-start"
    assert "time-slice" in done.stdout


def test_the_shared_gpu_example_renders_valid_pods_that_start_mps_before_ray():
    from railyard.stack import load_stack

    from .conftest import EXAMPLES

    objects = render(load_stack(str(EXAMPLES / "stack-shared-gpu.yaml")))
    _assert_valid(objects)
    (container,) = _worker_containers(objects)
    assert container["command"][0].count("nvidia-cuda-mps-control -d") == 1


# -- the kernel cache -------------------------------------------------------------------------------------------
def _engine_containers(objects):
    """(pod, container) of every pod that runs an engine: the Ray workers, or the single-engine pods."""
    return [(p, c) for p in _gpu_pods(objects) for c in p["spec"]["containers"]]


@pytest.mark.parametrize("mode", ["rayservice", "deployment"])
@pytest.mark.parametrize(("cache", "volume"), [
    ({}, {"emptyDir": {"sizeLimit": "4Gi"}}),
    ({"mode": "pod", "size_limit": "1Gi"}, {"emptyDir": {"sizeLimit": "1Gi"}}),
    ({"mode": "node", "host_path": "/mnt/railyard"}, {"hostPath": {"path": "/mnt/railyard", "type": "DirectoryOrCreate"}}),
    ({"mode": "image", "path": "/opt/railyard-cache"}, None),
], ids=["default", "pod", "node", "image"])
def test_every_engine_pod_finds_the_kernel_cache_where_the_stack_says(mode, cache, volume):
    objects = render(make_stack(ONE_GPU, kernel_cache=cache), mode)
    _assert_valid(objects)
    path = cache.get("path", "/var/cache/railyard")
    for pod, container in _engine_containers(objects):
        assert {"name": "RAILYARD_CACHE", "value": path} in container["env"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        if volume is None:  # in the image: nothing mounted over it
            assert "kernel-cache" not in volumes and path not in mounts.values()
        else:
            assert volumes["kernel-cache"] == {"name": "kernel-cache", **volume}
            assert mounts["kernel-cache"] == path
        assert pod["metadata"]["annotations"]["railyard.io/kernel-cache"].startswith(cache.get("mode", "pod") + ":")


def test_the_head_runs_no_engine_and_gets_no_kernel_cache():
    objects = render(make_stack(ONE_GPU, kernel_cache={"mode": "node"}), "rayservice")
    head = next(o for o in objects if o["kind"] == "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert "kernel-cache" not in str(head["template"])


@pytest.mark.parametrize(("cache", "field"), [({"mode": "volume"}, "mode"), ({"path": "cache"}, "path"),
                                              ({"size_limit": "big"}, "size_limit"), ({"colour": 1}, "colour")])
def test_a_bad_kernel_cache_is_one_error_naming_the_field(cache, field):
    with pytest.raises(ConfigError, match=f"kernel_cache.{field}"):
        make_stack(ONE_GPU, kernel_cache=cache)
