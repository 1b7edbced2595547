"""The Kubernetes manifests render, validate strictly offline, and agree with the code.

No API server can run here, so validation is offline: core kinds with ``kubernetes-validate
--strict`` (its Python API), KServe ``InferenceService`` against the vendored CRD schema with
``additionalProperties: false`` added (a misspelt field fails). Both overlays are rendered with
``kubectl kustomize`` and kustomize's default load restrictor, as ``kubectl apply -k``, ``make
deploy``, Argo CD and Flux render them (no flag). The last tests parse both sides of each
contract: pool ConfigMap vs the pool YAML the loader reads (the overlay's copy is byte-identical
to the package's file), Secret keys vs the pool's key variables, worker URLs vs worker
InferenceService names, image/port/model name vs serving code.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
OVERLAYS = ("dev", "prod")
K8S_VERSION = "1.33.0"
POD_HOLDERS = {"Deployment", "StatefulSet", "InferenceService"}


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not installed: the manifests are rendered with `kubectl kustomize`. "
            "Install it (Debian package `kubectl`, or the standalone `kustomize` binary) and re-run."
        )
    return path


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    # the default load restrictor (LoadRestrictionsRootOnly): what `kubectl apply -k` and GitOps use
    out = subprocess.run(
        [_kubectl(), "kustomize", str(MANIFESTS / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"kustomize failed for {overlay}: {out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties (unknown fields then fail)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def isvc_validator() -> jsonschema.Draft7Validator:
    with gzip.open(MANIFESTS / "schemas" / "serving.kserve.io_inferenceservices.json.gz") as f:
        crd = json.load(f)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # metadata is validated by the API server's ObjectMeta, not the CRD: allow it whole.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validate(doc: dict[str, Any]) -> list[str]:
    if doc.get("apiVersion", "").startswith("serving.kserve.io/"):
        assert doc["apiVersion"] == "serving.kserve.io/v1beta1", doc["apiVersion"]
        return [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in isvc_validator().iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc.message)]
    return []


def kinds(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "InferenceService":
        return doc["spec"]["predictor"]
    return doc["spec"]["template"]["spec"]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    if doc["kind"] == "InferenceService" and "model" in spec:
        return [spec["model"]]
    return list(spec["containers"])


# --- rendering and schema validation ------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_manifest_validates_strictly(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    errors = {f"{d['kind']}/{d['metadata']['name']}": validate(d) for d in docs}
    assert {k: v for k, v in errors.items() if v} == {}


def test_secret_templates_validate_and_hold_no_values() -> None:
    for path in sorted((MANIFESTS / "secrets").glob("*.template.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert validate(doc) == [], path.name
        secret_values = {k: v for k, v in doc["stringData"].items() if k not in {"POSTGRES_USER"}}
        assert all(v == "" for v in secret_values.values()), f"{path.name} carries a value"


def test_strict_validation_rejects_a_misspelt_field() -> None:
    isvc = copy.deepcopy(kinds(render("dev"), "InferenceService")["conductor"])
    isvc["spec"]["predictor"]["containers"][0]["imagePullPolcy"] = "Always"
    assert any("imagePullPolcy" in e for e in validate(isvc))
    deployment = copy.deepcopy(kinds(render("dev"), "Deployment")["mlflow"])
    deployment["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    assert validate(deployment)


# --- what the overlays must contain --------------------------------------------------------


def test_dev_is_one_cpu_conductor_without_gpu_workers() -> None:
    docs = render("dev")
    isvcs = kinds(docs, "InferenceService")
    assert set(isvcs) == {"conductor"}
    predictor = isvcs["conductor"]["spec"]["predictor"]
    assert predictor["minReplicas"] == predictor["maxReplicas"] == 1
    assert "nvidia.com/gpu" not in json.dumps(docs)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"rl-conductor-dev"}


def test_prod_has_gpu_workers_and_autoscaling() -> None:
    docs = render("prod")
    isvcs = kinds(docs, "InferenceService")
    workers = {n: d for n, d in isvcs.items() if n != "conductor"}
    assert set(workers) == {"qwen3-32b", "gemma-3-27b-it", "deepseek-r1-distill-qwen-32b"}
    for name, isvc in workers.items():
        model = isvc["spec"]["predictor"]["model"]
        assert model["modelFormat"]["name"] == "huggingface"
        assert "--backend=vllm" in model["args"] and f"--model_name={name}" in model["args"]
        gpus = model["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) >= 1
        assert f"--tensor-parallel-size={gpus}" in model["args"]
    conductor = isvcs["conductor"]["spec"]["predictor"]
    assert conductor["minReplicas"] >= 2 and conductor["maxReplicas"] > conductor["minReplicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_has_its_own_service_account_and_never_runs_as_root(overlay: str) -> None:
    docs = render(overlay)
    accounts = set(kinds(docs, "ServiceAccount"))
    seen: dict[str, str] = {}
    for doc in docs:
        if doc["kind"] not in POD_HOLDERS:
            continue
        spec = pod_spec(doc)
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        account = spec.get("serviceAccountName")
        assert account in accounts, f"{name} has no ServiceAccount of its own"
        if doc["kind"] != "InferenceService" or doc["metadata"]["name"] == "conductor":
            assert account not in seen, f"{name} shares {account} with {seen.get(account)}"
        seen.setdefault(account, name)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"].get("runAsUser", 1) != 0, name
        for container in containers(doc):
            ctx = container.get("securityContext", {})
            assert ctx.get("allowPrivilegeEscalation") is False, name
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], name
            assert container.get("resources", {}).get("limits"), f"{name} has no resource limits"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_lets_the_conductor_reach_only_workers_mlflow_dns_and_https(overlay: str) -> None:
    docs = render(overlay)
    policy = kinds(docs, "NetworkPolicy")["conductor"]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    conductor = kinds(docs, "InferenceService")["conductor"]["spec"]["predictor"]["labels"]
    assert all(conductor.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    allowed = []
    for rule in policy["spec"]["egress"]:
        ports = sorted(p["port"] for p in rule["ports"])
        for peer in rule["to"]:
            if "ipBlock" in peer:
                assert peer["ipBlock"]["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in peer["ipBlock"]["except"]
                allowed.append(("external", ports))
            else:
                allowed.append((json.dumps(peer["podSelector"]["matchLabels"], sort_keys=True), ports))
    assert sorted(allowed) == sorted(
        [
            ('{"rl-conductor/role": "worker"}', [8080]),
            ('{"rl-conductor/role": "mlflow"}', [5000]),
            ('{"k8s-app": "kube-dns"}', [53, 53]),
            ("external", [443]),
        ]
    )
    # the selectors match real pods: workers and mlflow carry the labels the policy names
    for doc in docs:
        if doc["kind"] == "InferenceService" and doc["metadata"]["name"] != "conductor":
            assert doc["spec"]["predictor"]["labels"]["rl-conductor/role"] == "worker"
    mlflow = kinds(docs, "Deployment")["mlflow"]["spec"]["template"]["metadata"]["labels"]
    assert mlflow["rl-conductor/role"] == "mlflow"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_configmap_and_secret_exists(overlay: str) -> None:
    docs = render(overlay)
    configmaps = set(kinds(docs, "ConfigMap"))
    templates = {
        yaml.safe_load(p.read_text())["metadata"]["name"]: yaml.safe_load(p.read_text())
        for p in (MANIFESTS / "secrets").glob("*.template.yaml")
    }
    text = json.dumps(docs)
    for ref in _walk(docs, "configMapKeyRef") + _walk(docs, "configMap"):
        assert ref["name"] in configmaps, ref
    for ref in _walk(docs, "secretKeyRef"):
        assert ref["name"] in templates, ref
        assert ref["key"] in templates[ref["name"]]["stringData"], ref
    for ref in _walk(docs, "secretRef"):
        assert ref["name"] in templates, ref
    assert "conductor-pool" in text


def _walk(node: Any, key: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict):
                found.append(v)
            found.extend(_walk(v, key))
    elif isinstance(node, list | tuple):
        for v in node:
            found.extend(_walk(v, key))
    return found


# --- the manifests agree with the code -----------------------------------------------------


def _template(name: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / "secrets" / f"{name}.template.yaml").read_text())


def test_pipeline_secrets_are_the_templates_the_manifests_ship() -> None:
    from pipelines import conductor_training as pipeline
    from pipelines import wiring

    inputs = pipeline.conductor_training.component_spec.inputs
    api_keys, s3 = inputs["api_keys_secret"].default, inputs["s3_secret"].default
    assert set(wiring.API_KEY_ENV) <= set(_template(api_keys)["stringData"])
    assert set(wiring.S3_ENV) <= set(_template(s3)["stringData"])


@pytest.mark.parametrize(("overlay", "pool_file"), [("dev", "paper-sim.yaml"), ("prod", "cluster.yaml")])
def test_pool_configmap_is_the_pool_yaml_the_loader_reads(
    overlay: str, pool_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_conductor.workers.pool import load_pool

    source = ROOT / "src" / "rl_conductor" / "configs" / "pools" / pool_file
    copy = MANIFESTS / "overlays" / overlay / "pool.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        f"{copy.relative_to(ROOT)} must be a byte-identical copy of {source.relative_to(ROOT)}, the "
        f"file the pool loader reads: cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}"
    )
    for worker in yaml.safe_load(source.read_text())["workers"]:  # the Secret's keys, as on a cluster
        if "api_key_env" in worker:
            monkeypatch.setenv(worker["api_key_env"], "test-key-not-a-secret")
    configmap = next(
        d
        for d in render(overlay)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("conductor-pool")
    )
    assert configmap["data"]["pool.yaml"] == source.read_text()
    isvc = kinds(render(overlay), "InferenceService")["conductor"]["spec"]["predictor"]
    mount = next(m for m in isvc["containers"][0]["volumeMounts"] if m["name"] == "pool")
    volume = next(v for v in isvc["volumes"] if v["name"] == "pool")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]  # the hash suffix reaches the pod
    assert f"--pool={mount['mountPath']}/pool.yaml" in isvc["containers"][0]["args"]
    assert load_pool(str(source)).view()  # the file the ConfigMap carries is a pool the code loads


def _label(dockerfile: Path) -> str:
    import re

    from components import images

    found = re.findall(
        rf'^LABEL {re.escape(images.IMAGE_LABEL)}="([^"]+)"$', dockerfile.read_text(), re.MULTILINE
    )
    assert len(found) == 1, f"{dockerfile} needs one {images.IMAGE_LABEL} label"
    return found[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_ones_the_dockerfiles_build(overlay: str) -> None:
    from importlib.metadata import version

    from components import images

    docs = render(overlay)
    conductor = kinds(docs, "InferenceService")["conductor"]["spec"]["predictor"]["containers"][0]
    assert conductor["image"] == images.SERVING_IMAGE == _label(ROOT / "serving" / "Dockerfile")
    mlflow = kinds(docs, "Deployment")["mlflow"]["spec"]["template"]["spec"]["containers"][0]
    assert mlflow["image"] == images.MLFLOW_IMAGE == _label(ROOT / "docker" / "Dockerfile.mlflow")
    assert images.MLFLOW_IMAGE.endswith(
        ":" + version("mlflow")
    )  # the server runs the pinned client's version


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_predictor_command_is_what_conductor_serve_parses(overlay: str) -> None:
    import re

    from rl_conductor.loop.serving import TrafficExtension
    from rl_conductor.serving import server

    container = kinds(render(overlay), "InferenceService")["conductor"]["spec"]["predictor"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["command"] == ["conductor", "serve"]
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    args = server.build_parser((TrafficExtension(),)).parse_args(argv)  # what conductor serve parses
    assert args.model == env["CONDUCTOR_MODEL_URI"] == server.DEFAULT_MODEL_URI
    assert args.model_name == server.DEFAULT_NAME
    assert [args.http_port] == [p["containerPort"] for p in container["ports"]]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == args.http_port
    assert container["readinessProbe"]["httpGet"]["path"] == f"/v2/models/{args.model_name}/ready"
    # tracing and the registry follow MLFLOW_TRACKING_URI, which points at the MLflow Service
    service = kinds(render(overlay), "Service")["mlflow"]
    assert (
        env["MLFLOW_TRACKING_URI"]
        == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    )


def test_cluster_pool_names_the_worker_inference_services_and_the_secret_keys() -> None:
    import re

    pool = yaml.safe_load((ROOT / "src" / "rl_conductor" / "configs" / "pools" / "cluster.yaml").read_text())
    isvcs = kinds(render("prod"), "InferenceService")
    keys = set(_template("conductor-api-keys")["stringData"])
    served = set()
    for worker in pool["workers"]:
        if worker["hosting"] == "self":
            # ${VAR:-http://NAME-predictor}/openai/v1: the default is the worker Service in-namespace
            match = re.fullmatch(r"\$\{\w+:-http://([a-z0-9-]+)-predictor\}/openai/v1", worker["base_url"])
            assert match, worker["base_url"]
            isvc = isvcs[match.group(1)]
            assert f"--model_name={worker['model']}" in isvc["spec"]["predictor"]["model"]["args"]
            served.add(match.group(1))
            assert "api_key_env" not in worker
        else:
            assert worker["api_key_env"] in keys, (
                f"{worker['name']}: {worker['api_key_env']} not in the Secret"
            )
    assert served == set(isvcs) - {"conductor"}  # every worker InferenceService is used by the pool
