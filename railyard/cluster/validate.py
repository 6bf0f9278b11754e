"""Validate manifests against the real schemas: Kubernetes' own OpenAPI (shipped by kubernetes-validate,
strict mode, for a chosen version) and the vendored KubeRay / VPA CRD schemas, which reference the same
Kubernetes definitions for the pod templates they embed.

Every problem names the object, the field path and why, and all of them are reported, not just the first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource

from railyard.cluster.quantity import parse_quantity
from railyard.errors import ConfigError

_K8S_DEFS = "https://kubernetes.io/api/_definitions.json"
# Custom resources railyard renders: (apiVersion, kind) -> (vendored schema file, its $defs entry).
_CRDS = {
    ("ray.io/v1", "RayService"): ("kuberay-v1.json", "RayService"),
    ("ray.io/v1", "RayCluster"): ("kuberay-v1.json", "RayCluster"),
    ("autoscaling.k8s.io/v1", "VerticalPodAutoscaler"): ("vpa-v1.json", "VerticalPodAutoscaler"),
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Problem:
    """One reason a manifest would be rejected: which object, which field, why."""

    source: str
    obj: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.obj}: {self.path or '(object)'}: {self.message}"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@lru_cache(maxsize=1)
def _schema_root():
    return resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")


@lru_cache(maxsize=1)
def supported_versions() -> list[str]:
    """Kubernetes minor versions whose schemas kubernetes-validate ships, oldest first."""
    found = set()
    for entry in _schema_root().iterdir():
        match = re.match(r"^v(\d+\.\d+)\.\d+-local-strict$", entry.name)
        if match:
            found.add(match.group(1))
    return sorted(found, key=_version_key)


def schema_version(kubernetes_version: str) -> str:
    """The newest shipped schema version not newer than the one asked for (as kubernetes-validate picks)."""
    wanted = kubernetes_version.removeprefix("v")
    if not re.match(r"^\d+\.\d+", wanted):
        raise ConfigError(f"Kubernetes version {kubernetes_version!r} must look like '1.30'")
    wanted = ".".join(wanted.split(".")[:2])
    versions = supported_versions()
    if _version_key(wanted) > _version_key(versions[-1]) or _version_key(wanted) < _version_key(versions[0]):
        raise ConfigError(
            f"Kubernetes {wanted} is outside the schemas installed ({versions[0]} to {versions[-1]}); "
            "pick one in range or upgrade kubernetes-validate"
        )
    return [v for v in versions if _version_key(v) <= _version_key(wanted)][-1]


def _schema_dir(version: str):
    return _schema_root().joinpath(f"v{version}.0-local-strict")


@lru_cache(maxsize=4)
def _registry(version: str) -> Registry:
    defs = json.loads(_schema_dir(version).joinpath("_definitions.json").read_text())
    return Registry().with_resource(_K8S_DEFS, Resource.from_contents(defs))


@lru_cache(maxsize=4)
def _vendored(name: str) -> dict[str, Any]:
    return json.loads(resources.files("railyard.cluster").joinpath("schemas", name).read_text())


@lru_cache(maxsize=256)
def _validator(version: str, api_version: str, kind: str) -> Draft202012Validator | None:
    registry = _registry(version)
    if (api_version, kind) in _CRDS:
        filename, entry = _CRDS[(api_version, kind)]
        doc = _vendored(filename)
        registry = registry.with_resource(doc["$id"], Resource.from_contents(doc))
        return Draft202012Validator({"$ref": f"{doc['$id']}#/$defs/{entry}"}, registry=registry)
    # kubernetes-validate's file naming: rbac.authorization.k8s.io/v1 -> rbac-v1, v1 -> v1.
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _schema_dir(version).joinpath(f"{kind.lower()}-{group}.json")
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    return Draft202012Validator(schema, registry=registry)


def _field_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(error: ValidationError) -> ValidationError:
    # anyOf/oneOf failures carry the real reason in their context; show the most specific one.
    if error.context:
        deeper = best_match(error.context)
        if deeper is not None and len(deeper.absolute_path) >= len(error.absolute_path):
            return deeper
    return error


def _quantities(node: Any, path: list[Any], out: list[tuple[str, str]]) -> None:
    # The OpenAPI schema types a Quantity as "string or integer"; the API server also parses it.
    if isinstance(node, dict):
        for key, value in node.items():
            here = path + [key]
            if key in ("requests", "limits", "minAllowed", "maxAllowed") and isinstance(value, dict):
                for res, qty in value.items():
                    if isinstance(qty, (str, int, float)) and not isinstance(qty, bool):
                        try:
                            parse_quantity(qty)
                        except ConfigError:
                            out.append(
                                (_field_path(here + [res]), f"{qty!r} is not a quantity (e.g. '8', '500m', '64Gi')")
                            )
            elif key == "sizeLimit" and isinstance(value, str):
                try:
                    parse_quantity(value)
                except ConfigError:
                    out.append((_field_path(here), f"{value!r} is not a quantity (e.g. '8Gi')"))
            else:
                _quantities(value, here, out)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _quantities(item, path + [i], out)


def _semantic(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """Checks the API server makes beyond the schema, for the fields railyard writes."""
    out: list[tuple[str, str]] = []
    _quantities(obj, [], out)
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        out.append(("metadata.name", "is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(str(name)):
        out.append(("metadata.name", f"{name!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')"))
    if obj.get("kind") == "RayService":
        text = (obj.get("spec") or {}).get("serveConfigV2")
        if isinstance(text, str):
            try:
                serve = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                out.append(("spec.serveConfigV2", f"is not valid YAML: {exc}"))
            else:
                if not isinstance(serve, dict) or not isinstance(serve.get("applications"), list):
                    out.append(("spec.serveConfigV2", "must be a Ray Serve config with an 'applications' list"))
    return out


# KubeRay's +kubebuilder:default values, which the API server applies before validating.
_WORKER_GROUP_DEFAULTS = {"replicas": 0, "minReplicas": 0, "maxReplicas": 2147483647, "numOfHosts": 1}


def _with_crd_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("apiVersion") != "ray.io/v1" or not isinstance(obj.get("spec"), dict):
        return obj
    spec = obj["spec"]
    cluster = spec.get("rayClusterConfig") if obj.get("kind") == "RayService" else spec
    if not isinstance(cluster, dict) or not isinstance(cluster.get("workerGroupSpecs"), list):
        return obj
    groups = [
        {**_WORKER_GROUP_DEFAULTS, **g} if isinstance(g, dict) else g for g in cluster["workerGroupSpecs"]
    ]
    cluster = {**cluster, "workerGroupSpecs": groups}
    if obj.get("kind") == "RayService":
        return {**obj, "spec": {**spec, "rayClusterConfig": cluster}}
    return {**obj, "spec": cluster}


def validate_object(obj: Any, kubernetes_version: str, source: str = "manifest") -> list[Problem]:
    """All problems with one object, or [] if the API server would accept it."""
    if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
        return [Problem(source, "?", "", "not a Kubernetes object: needs apiVersion and kind")]
    version = schema_version(kubernetes_version)
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    label = f"{kind}/{(obj.get('metadata') or {}).get('name', '?')}"
    validator = _validator(version, api_version, kind)
    if validator is None:
        return [Problem(source, label, "apiVersion", f"no schema for {api_version} {kind} in Kubernetes {version}")]
    problems = [
        Problem(source, label, _field_path(e.absolute_path), e.message)
        for e in map(_explain, validator.iter_errors(_with_crd_defaults(obj)))
    ]
    problems += [Problem(source, label, path, msg) for path, msg in _semantic(obj)]
    return sorted(problems, key=lambda p: p.path)


def validate_objects(objects: Iterable[Any], kubernetes_version: str, source: str = "manifest") -> list[Problem]:
    """Problems across many objects, in document order."""
    out: list[Problem] = []
    for obj in objects:
        out += validate_object(obj, kubernetes_version, source)
    return out


def load_manifests(path: str | Path) -> list[Any]:
    """The non-empty YAML documents of a manifest file."""
    path = Path(path)
    try:
        return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except FileNotFoundError:
        raise ConfigError(f"manifest file {path} not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
