"""The shipped deployment files are checked by tools that can refuse them: the Kubernetes manifests against
the Kubernetes API schemas (kubernetes-validate, offline, strict: an unknown field fails), the HAProxy
configuration by ``haproxy -c`` (Debian's haproxy, installed by scripts/test.sh)."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from observability import metrics
from tests.unit.test_observability import FakeHost

ROOT = Path(__file__).resolve().parents[2]
KUBE_DIR = ROOT / "deploy" / "kubernetes"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
KUBE_VERSION = "1.37.0"


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(KUBE_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def _by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in _documents() if doc["kind"] == kind}


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    docs = _documents()
    assert len(docs) >= 10
    for name, doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        assert doc["metadata"]["name"], name


def test_the_validator_refuses_a_misspelt_field_and_a_wrong_type():
    """The check above can fail: a probe with a misspelt key and a replica count given as text."""
    web = copy.deepcopy(_by_kind("Deployment")["chatsite-web"])
    web["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/readyz"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBE_VERSION, strict=True)
    web = copy.deepcopy(_by_kind("Deployment")["chatsite-web"])
    web["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBE_VERSION, strict=True)


def test_each_role_has_a_deployment_with_its_command_probes_and_resources():
    deployments = _by_kind("Deployment")
    assert set(deployments) == {"chatsite-web", "chatsite-worker-gpu", "chatsite-embeddings"}
    web = deployments["chatsite-web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["command"][0] == "daphne" and web["command"][-1] == "chatsite.asgi:application"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    gpu = deployments["chatsite-worker-gpu"]["spec"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "inference.$(INFERENCE_DEFAULT_MODEL)" in gpu["command"]
    embeddings = deployments["chatsite-embeddings"]["spec"]["template"]["spec"]["containers"][0]
    assert "embeddings.query,embeddings" in embeddings["command"]
    services = _by_kind("Service")
    assert (
        services["chatsite-web"]["spec"]["selector"]
        == deployments["chatsite-web"]["spec"]["selector"]["matchLabels"]
    )
    pdbs = _by_kind("PodDisruptionBudget")
    assert pdbs["chatsite-web"]["spec"]["minAvailable"] == 1


def test_the_worker_autoscaler_reads_a_series_the_workers_export():
    """The HPA's pods metric is served by the prometheus-adapter rule, whose series is one the workers
    export (a renamed gauge would leave the autoscaler blind)."""
    hpa = _by_kind("HorizontalPodAutoscaler")["chatsite-worker-gpu"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "chatsite-worker-gpu"
    metric_name = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rules = yaml.safe_load(_by_kind("ConfigMap")["chatsite-prometheus-adapter"]["data"]["config.yaml"])[
        "rules"
    ]
    rule = next(r for r in rules if r["name"]["as"] == metric_name)
    series = rule["seriesQuery"].split("{")[0].strip("'")

    exported = {family.name for family in metrics.EngineCollector(FakeHost()).collect()}
    assert series in exported, (series, exported)


def _haproxy_env(tmp_path: Path) -> dict[str, str]:
    key, cert, pem = tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "site.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=chatsite.test",
        ]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    return {
        **os.environ,
        "HAPROXY_HTTPS_BIND": "127.0.0.1:8443",
        "HAPROXY_HTTP_BIND": "127.0.0.1:8080",
        "HAPROXY_TLS_PEM": str(pem),
        "HAPROXY_RUNTIME_SOCKET": str(tmp_path / "admin.sock"),
        "CHATSITE_HOST": "chatsite.test",
        "CHATSITE_WEB1": "10.231.0.21:8000",
        "CHATSITE_WEB2": "10.231.0.22:8000",
    }


def _haproxy_check(cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(haproxy).exists(), "haproxy is not installed (scripts/test.sh installs Debian's package)"
    return subprocess.run([haproxy, "-c", "-f", str(cfg)], env=env, capture_output=True, text=True)


def test_haproxy_accepts_the_shipped_configuration(tmp_path):
    result = _haproxy_check(HAPROXY_CFG, _haproxy_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    text = HAPROXY_CFG.read_text()
    assert "timeout tunnel 1h" in text
    assert "uri /readyz" in text
    assert "level admin" in text


def test_haproxy_refuses_a_configuration_without_its_certificate(tmp_path):
    """``haproxy -c`` can fail: the shipped file with its certificate missing, and with a typo."""
    env = _haproxy_env(tmp_path)
    env["HAPROXY_TLS_PEM"] = str(tmp_path / "missing.pem")
    assert _haproxy_check(HAPROXY_CFG, env).returncode != 0
    broken = tmp_path / "broken.cfg"
    broken.write_text(HAPROXY_CFG.read_text().replace("timeout tunnel 1h", "timeout tunel 1h"))
    assert _haproxy_check(broken, _haproxy_env(tmp_path)).returncode != 0
