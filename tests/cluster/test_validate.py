"""Broken manifests fail validation, and each problem names the object, the field path and why."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from railyard.cluster.render import render, to_yaml
from railyard.cluster.validate import load_manifests, schema_version, validate_object, validate_objects
from railyard.errors import ConfigError

from .conftest import ONE_GPU, TP2, make_stack


@pytest.fixture
def rayservice():
    return copy.deepcopy(render(make_stack(TP2), "rayservice")[0])


@pytest.fixture
def deployment():
    return copy.deepcopy(render(make_stack(ONE_GPU), "deployment")[0])


def _paths(problems):
    return {p.path: p.message for p in problems}


def test_a_misspelled_container_field_is_named_like_kubernetes_validate_names_it(deployment):
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError) as oracle:
        kubernetes_validate.validate(deployment, "1.30", strict=True)
    problems = validate_object(deployment, "1.30")
    assert _paths(problems) == {
        "spec.template.spec.containers[0]": "Additional properties are not allowed ('resource' was unexpected)"
    }
    assert problems[0].message == oracle.value.message


def test_a_wrong_type_names_the_field(deployment):
    deployment["spec"]["replicas"] = "two"
    assert "'two' is not of type" in _paths(validate_object(deployment, "1.30"))["spec.replicas"]


def test_a_bad_quantity_names_the_resource(deployment):
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "64GB"
    problems = _paths(validate_object(deployment, "1.30"))
    assert "'64GB' is not a quantity" in problems["spec.template.spec.containers[0].resources.limits.memory"]


def test_a_missing_worker_group_name_is_reported_against_the_kuberay_schema(rayservice):
    del rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    problems = _paths(validate_object(rayservice, "1.30"))
    assert problems == {"spec.rayClusterConfig.workerGroupSpecs[0]": "'groupName' is a required property"}


def test_a_pod_template_inside_a_rayservice_is_checked_as_strictly_as_a_deployment(rayservice):
    template = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]
    template["spec"]["tolerations"][0]["effect"] = 1
    problems = _paths(validate_object(rayservice, "1.30"))
    assert (
        "1 is not of type" in problems["spec.rayClusterConfig.workerGroupSpecs[0].template.spec.tolerations[0].effect"]
    )


def test_an_unknown_rayservice_field_is_an_error_not_pruned(rayservice):
    rayservice["spec"]["serveConfig"] = "applications: []"
    assert "'serveConfig' was unexpected" in _paths(validate_object(rayservice, "1.30"))["spec"]


def test_serve_config_v2_must_be_a_ray_serve_config(rayservice):
    rayservice["spec"]["serveConfigV2"] = "just: text"
    assert "applications" in _paths(validate_object(rayservice, "1.30"))["spec.serveConfigV2"]


def test_kuberay_enums_are_enforced(rayservice):
    rayservice["spec"]["rayClusterConfig"]["autoscalerOptions"] = {"upscalingMode": "Fast"}
    problems = _paths(validate_object(rayservice, "1.30"))
    assert "'Fast' is not one of" in problems["spec.rayClusterConfig.autoscalerOptions.upscalingMode"]


def test_an_invalid_object_name_is_reported(deployment):
    deployment["metadata"]["name"] = "Railyard_Engine"
    assert "DNS-1123" in _paths(validate_object(deployment, "1.30"))["metadata.name"]


def test_every_problem_is_reported_not_just_the_first(deployment):
    deployment["spec"]["replicas"] = "two"
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert len(validate_object(deployment, "1.30")) == 2


def test_an_unknown_kind_says_there_is_no_schema():
    (problem,) = validate_object({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}, "1.30")
    assert "no schema for example.com/v1 Widget" in problem.message


def test_a_field_added_after_the_chosen_kubernetes_version_is_rejected_for_it(deployment):
    # Pod-level resources (spec.resources) arrived in Kubernetes 1.32.
    deployment["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "8"}}
    assert "'resources' was unexpected" in _paths(validate_object(deployment, "1.30"))["spec.template.spec"]
    assert validate_object(deployment, "1.33") == []


def test_versions_outside_the_installed_schemas_are_a_config_error():
    with pytest.raises(ConfigError, match="outside the schemas installed"):
        schema_version("1.99")
    assert schema_version("v1.30.4") == "1.30"


def test_files_round_trip_through_load_manifests(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(to_yaml(render(make_stack(TP2), "rayservice")))
    assert validate_objects(load_manifests(path), "1.30", str(path)) == []


def test_defaulted_kuberay_fields_may_be_omitted_as_the_api_server_fills_them(rayservice):
    group = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    for field in ("minReplicas", "maxReplicas", "replicas"):
        del group[field]
    assert validate_object(rayservice, "1.30") == []


def test_a_required_kuberay_field_without_a_default_may_not(rayservice):
    del rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParams"]
    problems = _paths(validate_object(rayservice, "1.30"))
    assert problems == {"spec.rayClusterConfig.workerGroupSpecs[0]": "'rayStartParams' is a required property"}
