"""Pod templates for engine replicas and the Ray head, with each production policy applied where switched on.

Why each policy exists:
- gpu_limits: the device plugin only hands a container GPUs it asked for in limits.
- gpu_toleration: GPU nodes are tainted `nvidia.com/gpu:NoSchedule` so only GPU work lands there.
- gpu_node_affinity: GFD labels pin a replica to the GPU product (and per-node GPU count) it was sized for.
- spread: replicas of one deployment on different nodes and zones, so one node loss is one replica.
- probes: readiness gates traffic, liveness restarts a dead engine, startup covers slow model loading.
- resources: requests = limits gives Guaranteed QoS, the last class the kubelet evicts.
- shm: NCCL and torch need a large /dev/shm; the container default of 64Mi crashes tensor parallelism.
- security_context: non-root, no privilege escalation, no capabilities; GPUs need none of them.
- prometheus: scrape annotations for the engine's /metrics.
- gpu_sharing mps (Ray workers whose replicas share a GPU): a CUDA MPS control daemon started before `ray start`
  (KubeRay runs a container's command, then `&& ray start ...`), every process of the container its client.
- kernel_cache (every pod that runs an engine): $RAILYARD_CACHE where the stack's kernel_cache says, mounted there
  (a pod's emptyDir, a node's hostPath) or found in the image, so a replica loads the kernels an earlier one compiled.
"""

from __future__ import annotations

import math
from typing import Any

from railyard.cluster.lora import lora_cli_args, mount_adapters
from railyard.envs import RAILYARD_CACHE
from railyard.stack import KernelCache, Policies, Stack, StackModel

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
HOSTNAME_KEY = "kubernetes.io/hostname"
ZONE_KEY = "topology.kubernetes.io/zone"
HTTP_PORT = 8000
RAY_METRICS_PORT = 8080
HEAD_RESOURCES = {"cpu": "2", "memory": "8Gi"}
RUN_AS_USER = 1000
WORKER_GRACE_MARGIN_S = 30  # a worker pod's grace beyond its replica's drain: the raylet's own exit
MPS_PIPE_DIR, MPS_LOG_DIR = "/tmp/nvidia-mps", "/tmp/nvidia-mps-log"
# Exits 0 either way, so `ray start` runs after it: without the daemon the replicas time-slice, as they would anyway.
MPS_START = (f"( (mkdir -p {MPS_PIPE_DIR} {MPS_LOG_DIR} && nvidia-cuda-mps-control -d) || echo 'railyard: no CUDA MPS "
             "daemon (nvidia-cuda-mps-control missing or failed); replicas sharing this GPU time-slice' )")
GPU_SHARING_ANNOTATION = "railyard.io/gpu-sharing"
SERVE_PROXY_ANNOTATION = "railyard.io/serve-proxy"
KERNEL_CACHE_ANNOTATION = "railyard.io/kernel-cache"
KERNEL_CACHE_VOLUME = "kernel-cache"


def labels(stack: Stack, component: str, model: str | None = None) -> dict[str, str]:
    """Labels on every object and pod; (instance, component) selects one group's pods."""
    out = {
        "app.kubernetes.io/name": "railyard",
        "app.kubernetes.io/instance": stack.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "railyard",
    }
    if model is not None:
        out["railyard.io/model"] = model
    return out


def selector(stack: Stack, component: str) -> dict[str, str]:
    """The labels that pick exactly one group's pods (for spreading, PDBs and Services)."""
    return {"app.kubernetes.io/instance": stack.name, "app.kubernetes.io/component": component}


def gpu_product(stack: Stack, model: StackModel) -> str | None:
    return model.gpu_product or stack.gpu_product


def _resources(cpu: str, memory: str, gpus: int, policies: Policies) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if policies.resources:
        requests.update({"cpu": cpu, "memory": memory})
        limits.update({"cpu": cpu, "memory": memory})
    if policies.gpu_limits and gpus:
        limits[GPU_RESOURCE] = gpus  # extended resources: requests default to limits
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _security(policies: Policies) -> tuple[dict[str, Any], dict[str, Any]]:
    if not policies.security_context:
        return {}, {}
    pod = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _gpu_affinity(stack: Stack, model: StackModel) -> dict[str, Any] | None:
    if not stack.policies.gpu_node_affinity:
        return None
    # GFD's gpu.count is an integer label: Gt tp-1 keeps TP replicas off nodes too small to hold them.
    expressions = [{"key": GPU_COUNT_LABEL, "operator": "Gt", "values": [str(model.tensor_parallel_size - 1)]}]
    product = gpu_product(stack, model)
    if product:
        expressions.insert(0, {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [product]})
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
    }


def _spread(stack: Stack, component: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    mode = stack.policies.spread
    if mode == "off":
        return None, []
    term = {"labelSelector": {"matchLabels": selector(stack, component)}, "topologyKey": HOSTNAME_KEY}
    if mode == "required":
        anti = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    else:
        anti = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    zones = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE_KEY,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector(stack, component)},
        }
    ]
    return anti, zones


def _http_probe(path: str, port: int | str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _probes(path: str, port: int | str) -> dict[str, Any]:
    # The startup probe allows 20 minutes for loading weights before liveness may restart the pod.
    return {
        "startupProbe": _http_probe(path, port, 10, 120),
        "readinessProbe": _http_probe(path, port, 5, 3),
        "livenessProbe": _http_probe(path, port, 10, 6),
    }


def _pod(
    stack: Stack,
    component: str,
    container: dict[str, Any],
    *,
    model: StackModel | None,
    gpus: int,
    shm: str | None,
    metrics_port: int,
    grace_s: int = 60,
    kernel_cache: KernelCache | None = None,
) -> dict[str, Any]:
    policies = stack.policies
    pod_security, container_security = _security(policies)
    if container_security:
        container["securityContext"] = container_security
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": grace_s}
    if pod_security:
        spec["securityContext"] = pod_security
    if shm and policies.shm:
        spec.setdefault("volumes", []).append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        container.setdefault("volumeMounts", []).append({"name": "dshm", "mountPath": "/dev/shm"})
    if kernel_cache is not None:
        _mount_kernel_cache(kernel_cache, spec, container)
    affinity: dict[str, Any] = {}
    if model is not None and gpus:
        if policies.gpu_toleration:
            spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
        node_affinity = _gpu_affinity(stack, model)
        if node_affinity:
            affinity["nodeAffinity"] = node_affinity
    if model is not None:
        anti, zones = _spread(stack, component)
        if anti:
            affinity["podAntiAffinity"] = anti
        if zones:
            spec["topologySpreadConstraints"] = zones
    if affinity:
        spec["affinity"] = affinity
    metadata: dict[str, Any] = {"labels": labels(stack, component, model.name if model else None)}
    if policies.prometheus:
        metadata["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(metrics_port),
            "prometheus.io/path": "/metrics",
        }
    if kernel_cache is not None:  # the mode's reason, on the pod whose starts it makes warm or cold
        metadata.setdefault("annotations", {})[KERNEL_CACHE_ANNOTATION] = (
            f"{kernel_cache.mode}: " + type(kernel_cache).model_fields["mode"].description)
    return {"metadata": metadata, "spec": spec}


def _mount_kernel_cache(cache: KernelCache, spec: dict[str, Any], container: dict[str, Any]) -> None:
    """$RAILYARD_CACHE at the cache's path, and for the pod and node modes the volume mounted there."""
    container.setdefault("env", []).append({"name": RAILYARD_CACHE.name, "value": cache.path})
    if cache.mode == "image":  # in the image already: nothing to mount
        return
    if cache.mode == "pod":
        volume: dict[str, Any] = {"name": KERNEL_CACHE_VOLUME, "emptyDir": {"sizeLimit": cache.size_limit}}
    else:
        volume = {"name": KERNEL_CACHE_VOLUME, "hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
    spec.setdefault("volumes", []).append(volume)
    container.setdefault("volumeMounts", []).append({"name": KERNEL_CACHE_VOLUME, "mountPath": cache.path})


def engine_cli_args(model: StackModel, engine: dict[str, Any]) -> list[str]:
    """`railyard serve` arguments for one single-engine pod (Deployment mode): EngineConfig fields as
    kebab-case flags, as railyard.engine.args derives them."""
    args = ["serve", "--model", model.model, "--served-model-name", model.name]
    args += ["--host", "0.0.0.0", "--port", str(HTTP_PORT)]
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])  # the engine's BooleanOptionalAction flags
        else:
            args += [flag, str(value)]
    return args


def engine_pod(stack: Stack, model: StackModel, component: str, engine: dict[str, Any]) -> dict[str, Any]:
    """A plain single-engine pod template: `railyard serve` on port 8000 with /health probes."""
    container: dict[str, Any] = {
        "name": "engine",
        "image": stack.image,
        "command": ["railyard"],
        "args": engine_cli_args(model, engine) + lora_cli_args(model.lora, stack.ingress.lora_runtime_updates),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
    }
    resources = _resources(model.resources.cpu, model.resources.memory, model.tensor_parallel_size, stack.policies)
    if resources:
        container["resources"] = resources
    if stack.policies.probes:
        container.update(_probes("/health", "http"))
    template = _pod(
        stack,
        component,
        container,
        model=model,
        gpus=model.tensor_parallel_size,
        shm=model.resources.shm,
        metrics_port=HTTP_PORT,
        kernel_cache=stack.kernel_cache,
    )
    mount_adapters(template, model.name, model.lora)
    return template


def _ray_ports(head: bool) -> list[dict[str, Any]]:
    ports = [{"name": "metrics", "containerPort": RAY_METRICS_PORT, "protocol": "TCP"}]
    if head:
        ports = [
            {"name": "gcs", "containerPort": 6379, "protocol": "TCP"},
            {"name": "dashboard", "containerPort": 8265, "protocol": "TCP"},
            {"name": "client", "containerPort": 10001, "protocol": "TCP"},
            {"name": "serve", "containerPort": HTTP_PORT, "protocol": "TCP"},
        ] + ports
    return ports


def ray_worker_pod(stack: Stack, model: StackModel, component: str) -> dict[str, Any]:
    """A KubeRay worker pod holding one replica: tensor_parallel_size GPUs, so STRICT_PACK fits in one pod."""
    container: dict[str, Any] = {"name": "ray-worker", "image": stack.image, "ports": _ray_ports(head=False)}
    resources = _resources(model.resources.cpu, model.resources.memory, model.tensor_parallel_size, stack.policies)
    if resources:
        container["resources"] = resources
    if stack.policies.probes:
        # Probe the raylet, as KubeRay does: an app-level probe would hold the pod unready while
        # KubeRay waits for ready pods before it deploys the app.
        container["readinessProbe"] = _http_probe("/api/local_raylet_healthz", 52365, 5, 10)
        container["livenessProbe"] = _http_probe("/api/local_raylet_healthz", 52365, 10, 12)
    container["env"] = _ray_env(stack)
    if model.mps_shared:
        container["command"] = [MPS_START]
        container["env"] += [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": MPS_PIPE_DIR},
                             {"name": "CUDA_MPS_LOG_DIRECTORY", "value": MPS_LOG_DIR}]
    template = _pod(
        stack,
        component,
        container,
        model=model,
        gpus=model.tensor_parallel_size,
        shm=model.resources.shm,
        metrics_port=RAY_METRICS_PORT,
        # Kubernetes must not kill a worker pod before Serve has drained its replica's generations.
        grace_s=math.ceil(model.lifecycle.graceful_shutdown_timeout_s) + WORKER_GRACE_MARGIN_S,
        kernel_cache=stack.kernel_cache,
    )
    if model.mps_shared:  # the reason, on the pod where the daemon runs
        annotations = template["metadata"].setdefault("annotations", {})
        annotations[GPU_SHARING_ANNOTATION] = type(model).model_fields["gpu_sharing"].description
    _mount_every_models_adapters(stack, template)
    return template


def ray_head_pod(stack: Stack) -> dict[str, Any]:
    """The Ray head: GCS, dashboard, Serve controller and HTTP proxy; no GPUs, so no GPU policies."""
    container: dict[str, Any] = {"name": "ray-head", "image": stack.image, "ports": _ray_ports(head=True),
                                 "env": _ray_env(stack)}
    resources = _resources(HEAD_RESOURCES["cpu"], HEAD_RESOURCES["memory"], 0, stack.policies)
    if resources:
        container["resources"] = resources
    if stack.policies.probes:
        container["readinessProbe"] = _http_probe("/api/gcs_healthz", 8265, 5, 10)
        container["livenessProbe"] = _http_probe("/api/gcs_healthz", 8265, 10, 12)
    template = _pod(stack, "head", container, model=None, gpus=0, shm="2Gi", metrics_port=RAY_METRICS_PORT)
    # The proxy's reason, on the pod whose Serve controller starts the proxies (every Ray pod has the env).
    template["metadata"].setdefault("annotations", {})[SERVE_PROXY_ANNOTATION] = (
        type(stack.ingress).model_fields["proxy"].description)
    _mount_every_models_adapters(stack, template)
    return template


def _mount_every_models_adapters(stack: Stack, template: dict[str, Any]) -> None:
    """Every Ray pod mounts every model's LoRA adapters: a replica loads its model's, and an ingress replica (on
    any pod) checks an adapter's files when it is named, before any replica loads it."""
    for model in stack.models:
        mount_adapters(template, model.name, model.lora)


def _ray_env(stack: Stack) -> list[dict[str, str]]:
    """What every Ray process of the cluster reads at start: the stack's choice of Serve proxy."""
    return [{"name": name, "value": value} for name, value in stack.ingress.ray_env().items()]
