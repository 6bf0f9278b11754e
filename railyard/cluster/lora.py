"""LoRA adapters in rendered pods: the volume (and, for an image source, the init container that fills it) that
brings a model's adapter directories to every pod serving it, and the `railyard serve` flags that load them."""

from __future__ import annotations

import re
from typing import Any

from railyard.stack import AdapterSource, ModelLoRA

COPY_CONTAINER = "lora-adapters"


def volume_name(model_name: str) -> str:
    """The pod volume of a model's adapters (a DNS label: model names are at most 30 characters)."""
    return re.sub(r"[^a-z0-9-]", "-", f"lora-{model_name}")[:63].strip("-")


def adapter_volume(model_name: str, source: AdapterSource) -> tuple[dict[str, Any], dict[str, Any],
                                                                     dict[str, Any] | None]:
    """(volume, the serving container's read-only mount, the init container that copies an image source or None)."""
    name = volume_name(model_name)
    mount = {"name": name, "mountPath": source.mount_path, "readOnly": True}
    if source.persistent_volume_claim:
        return ({"name": name, "persistentVolumeClaim": {"claimName": source.persistent_volume_claim,
                                                         "readOnly": True}}, mount, None)
    if source.host_path:
        return {"name": name, "hostPath": {"path": source.host_path, "type": "Directory"}}, mount, None
    empty_dir: dict[str, Any] = {"sizeLimit": source.size_limit} if source.size_limit else {}
    copy = {
        "name": f"{COPY_CONTAINER}-{model_name}"[:63],
        "image": source.image,
        # The image's directory, contents and all, into the emptyDir the engine then reads (no network at start).
        "command": ["cp", "-R", f"{source.image_path.rstrip('/')}/.", source.mount_path],
        "volumeMounts": [{"name": name, "mountPath": source.mount_path}],
    }
    return {"name": name, "emptyDir": empty_dir}, mount, copy


def mount_adapters(pod_template: dict[str, Any], model_name: str, lora: ModelLoRA | None) -> None:
    """Add a model's adapter source to a pod template (every container mounts it read-only; an image source is
    copied in by an init container that runs with the pod's security context)."""
    if lora is None or lora.source is None:
        return
    volume, mount, copy = adapter_volume(model_name, lora.source)
    spec = pod_template["spec"]
    spec.setdefault("volumes", []).append(volume)
    for container in spec["containers"]:
        container.setdefault("volumeMounts", []).append(dict(mount))
    if copy is not None:
        security = spec["containers"][0].get("securityContext")
        if security:
            copy["securityContext"] = dict(security)
        spec.setdefault("initContainers", []).append(copy)


def lora_cli_args(lora: ModelLoRA | None, runtime_updates: bool = False) -> list[str]:
    """`railyard serve` flags that serve the adapters (--lora-modules name=path, as vLLM takes them)."""
    args = []
    if lora is not None and lora.adapters:
        args += ["--lora-modules", *(f"{name}={path}" for name, path in lora.pod_paths().items())]
    if runtime_updates:
        args.append("--enable-lora-runtime-updates")
    return args
