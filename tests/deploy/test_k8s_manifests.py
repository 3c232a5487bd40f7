"""deploy/k8s validates offline against a pinned Kubernetes version, and says what a board farm needs.

kubernetes-validate checks each object against the OpenAPI schemas of that
Kubernetes release (strict: unknown fields are errors). It runs as a CLI, as
CI would run it; a deliberately broken copy of each manifest must fail, so a
validator that passes everything would not go unnoticed.
"""
import copy
import subprocess
import sys

import pytest
import yaml

from deploy_helpers import DOCKERFILE, K8S, entry_command, flag_value, healthcheck, parse_dockerfile

#: The Kubernetes release the manifests must be valid for (grpc probes are GA since 1.27).
K8S_VERSION = "1.31.0"


def manifests():
    files = sorted(K8S.glob("*.yaml"))
    assert files, f"no manifests in {K8S}"
    return files


def objects():
    found = {}
    for path in manifests():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def validate(*paths):
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", K8S_VERSION,
                           *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_manifests_validate_against_pinned_kubernetes():
    proc = validate(*manifests())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for kind, name in objects():
        assert f"{kind.lower()}/{name} against version {K8S_VERSION.rsplit('.', 1)[0]}" in out, out


def _daemonset(objs):
    return copy.deepcopy(objs[("DaemonSet", "bpuemu-board")])


def _container(d):
    return d["spec"]["template"]["spec"]["containers"][0]


#: kind -> (how to break the DaemonSet, what the validator must say)
BREAKAGES = {
    "port_type": (lambda d: _container(d)["ports"][0].update(containerPort="grpc"),
                  "containerPort: 'grpc' is not of type 'integer'"),
    # strict validation: a misspelt field is an error, not ignored
    "unknown_field": (lambda d: d["spec"]["template"]["spec"].update(nodeSelectr=d["spec"]["template"]["spec"].pop("nodeSelector")),
                      "'nodeSelectr' was unexpected"),
    "missing_name": (lambda d: _container(d).pop("name"), "'name' is a required property"),
    "probe_port": (lambda d: _container(d)["readinessProbe"]["grpc"].update(port="x"),
                   "readinessProbe.grpc.port: 'x' is not of type 'integer'"),
}


@pytest.mark.parametrize("kind", sorted(BREAKAGES))
def test_broken_copy_fails_validation(tmp_path, kind):
    broken = _daemonset(objects())
    breaker, message = BREAKAGES[kind]
    breaker(broken)
    path = tmp_path / f"daemonset-{kind}.yaml"
    path.write_text(yaml.safe_dump(broken))
    proc = validate(path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"a broken manifest ({kind}) passed validation:\n{out}"
    assert "did not validate" in out and message in out, out


def test_daemonset_runs_one_board_per_arm64_node():
    objs = objects()
    ds = objs[("DaemonSet", "bpuemu-board")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"resources.{kind}"


def test_probes_are_native_grpc_health_on_the_daemon_port():
    objs = objects()
    container = objs[("DaemonSet", "bpuemu-board")]["spec"]["template"]["spec"]["containers"][0]
    (port,) = [p for p in container["ports"] if p["name"] == "grpc"]
    listen = flag_value(entry_command(parse_dockerfile(DOCKERFILE)[-1]), "--listen")
    assert port["containerPort"] == int(listen.rsplit(":", 1)[1])
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == port["containerPort"], probe
        assert "exec" not in container[probe] and "httpGet" not in container[probe], probe
    # Readiness names the board service itself; liveness asks about the whole server.
    assert container["readinessProbe"]["grpc"]["service"] == "bpuemu.board.v1.Board"


def test_token_secret_lands_where_the_image_reads_it():
    objs = objects()
    pod = objs[("DaemonSet", "bpuemu-board")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    token_path = flag_value(entry_command(parse_dockerfile(DOCKERFILE)[-1]), "--token-file")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == token_path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "bpuemu-board-token"
    assert mount["readOnly"] is True
    assert mount["subPath"] in [item["path"] for item in volume["secret"]["items"]]
    # Readable by the pod's group (fsGroup), by no one else.
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    model_dir = flag_value(entry_command(parse_dockerfile(DOCKERFILE)[-1]), "--model-dir")
    assert model_dir in [m["mountPath"] for m in container["volumeMounts"]], "the model store must be a volume"


def test_headless_service_selects_the_board_pods():
    objs = objects()
    svc = objs[("Service", "bpuemu-board")]
    ds = objs[("DaemonSet", "bpuemu-board")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    container_ports = {p["name"]: p["containerPort"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert port["targetPort"] in container_ports and port["port"] == container_ports[port["targetPort"]]


def test_image_healthcheck_probes_the_same_port():
    stage = parse_dockerfile(DOCKERFILE)[-1]
    hc = healthcheck(stage)
    listen_port = flag_value(entry_command(stage), "--listen").rsplit(":", 1)[1]
    assert flag_value(hc.argv, "--target").rsplit(":", 1)[1] == listen_port


def test_metrics_port_is_exposed_and_annotated_for_scraping():
    pod_template = objects()[("DaemonSet", "bpuemu-board")]["spec"]["template"]
    container = pod_template["spec"]["containers"][0]
    listen = flag_value(container["args"], "--metrics-listen")
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert port["containerPort"] == int(listen.rsplit(":", 1)[1])
    annotations = pod_template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
    # Beyond loopback the endpoint needs the token: the image's entry command passes it.
    assert not listen.startswith("127.") and flag_value(entry_command(parse_dockerfile(DOCKERFILE)[-1]), "--token-file")
