"""deploy/ manifests: YAML structure and field names per the KubeRay v1 and Kubernetes APIs.

The allowed key sets are the fields of the KubeRay v1 CRDs (ray-operator/apis/ray/v1:
RayClusterSpec, HeadGroupSpec, WorkerGroupSpec, RayJobSpec), so a misspelt field (e.g.
``workerGroupSpec``) fails here instead of being silently dropped by the API server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

RAYCLUSTER_SPEC = {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling",
                   "autoscalerOptions", "headServiceAnnotations", "suspend", "managedBy",
                   "gcsFaultToleranceOptions", "upgradeStrategy"}
HEAD_GROUP = {"serviceType", "headService", "enableIngress", "rayStartParams", "template",
              "resources", "labels"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "idleTimeoutSeconds",
                "rayStartParams", "template", "scaleStrategy", "suspend", "numOfHosts",
                "resources", "labels"}
RAYJOB_SPEC = {"entrypoint", "metadata", "runtimeEnvYAML", "jobId", "shutdownAfterJobFinishes",
               "ttlSecondsAfterFinished", "activeDeadlineSeconds", "rayClusterSpec",
               "clusterSelector", "submitterPodTemplate", "submitterConfig",
               "entrypointNumCpus", "entrypointNumGpus", "entrypointResources", "submissionMode",
               "suspend", "backoffLimit", "managedBy", "deletionStrategy"}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _check_pod_template(tpl: dict, where: str) -> None:
    assert set(tpl) <= {"metadata", "spec"}, where
    containers = tpl["spec"]["containers"]
    assert containers and all("name" in c and "image" in c for c in containers), where


def _check_raycluster_spec(spec: dict, where: str) -> None:
    assert set(spec) <= RAYCLUSTER_SPEC, (where, set(spec) - RAYCLUSTER_SPEC)
    assert spec["rayVersion"] == "2.60.0"          # matches the image's Ray
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_GROUP, (where, set(head) - HEAD_GROUP)
    assert isinstance(head["rayStartParams"], dict)
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    _check_pod_template(head["template"], where + ".headGroupSpec")
    assert spec["workerGroupSpecs"]
    for g in spec["workerGroupSpecs"]:
        assert set(g) <= WORKER_GROUP, (where, set(g) - WORKER_GROUP)
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        assert isinstance(g["rayStartParams"], dict)
        _check_pod_template(g["template"], where + ".workerGroupSpecs")


def _check_rayjob(doc: dict, where: str) -> None:
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert set(spec) <= RAYJOB_SPEC, (where, set(spec) - RAYJOB_SPEC)
    assert spec["entrypoint"].startswith("charon-search ")
    assert "--ray-address auto" in spec["entrypoint"]
    assert spec["submissionMode"] in SUBMISSION_MODES
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int)
    yaml.safe_load(spec.get("runtimeEnvYAML", "{}"))
    _check_raycluster_spec(spec["rayClusterSpec"], where + ".rayClusterSpec")


def test_raycluster():
    (doc,) = _docs("raycluster.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert doc["metadata"]["name"]
    _check_raycluster_spec(doc["spec"], "raycluster")


def test_rayjob_runs_a_search():
    (doc,) = _docs("rayjob-search.yaml")
    _check_rayjob(doc, "rayjob-search")
    assert " search spaces/" in doc["spec"]["entrypoint"]
    assert (DEPLOY.parent / doc["spec"]["entrypoint"].split()[2]).exists()


def test_cronjob_creates_a_rayjob_with_rbac():
    docs = {d["kind"]: d for d in _docs("cronjob-sweep.yaml")}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "CronJob"}
    cron = docs["CronJob"]
    assert cron["apiVersion"] == "batch/v1"
    assert len(cron["spec"]["schedule"].split()) == 5
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("OnFailure", "Never")
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    cmd = pod["containers"][0]["command"]
    assert cmd[:3] == ["kubectl", "create", "-f"]
    # RBAC: the service account may create rayjobs
    rule = docs["Role"]["rules"][0]
    assert rule["apiGroups"] == ["ray.io"] and "rayjobs" in rule["resources"]
    assert "create" in rule["verbs"]
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]
    # the mounted template is a RayJob with generateName (one per night)
    (tmpl_name,) = docs["ConfigMap"]["data"]
    assert cmd[3] == f"/templates/{tmpl_name}"
    rayjob = yaml.safe_load(docs["ConfigMap"]["data"][tmpl_name])
    assert rayjob["metadata"]["generateName"].endswith("-")
    _check_rayjob(rayjob, "cronjob template")
    assert " sweep sweeps/" in rayjob["spec"]["entrypoint"]
    assert (DEPLOY.parent / rayjob["spec"]["entrypoint"].split()[2]).exists()


def test_cluster_launcher():
    (doc,) = _docs("cluster-launcher.yaml")
    for key in ("cluster_name", "max_workers", "provider", "available_node_types",
                "head_node_type", "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in doc, key
    assert doc["head_node_type"] in doc["available_node_types"]
    for node in doc["available_node_types"].values():
        assert "node_config" in node and "resources" in node


@pytest.mark.parametrize("name", ["Dockerfile", "README.md"])
def test_image_and_readme_present(name):
    text = (DEPLOY / name).read_text()
    if name == "Dockerfile":
        assert "FROM rayproject/ray:2.60.0" in text
        for folder in ("spaces", "objectives", "sweeps"):
            assert f"COPY {folder}" in text
    else:
        for f in ("raycluster.yaml", "rayjob-search.yaml", "cronjob-sweep.yaml",
                  "cluster-launcher.yaml", "--ray-address"):
            assert f in text
