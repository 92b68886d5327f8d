"""deploy/k8s/ validated by kubernetes-validate (strict: unknown fields refused) against
the OpenAPI schemas of the Kubernetes release the package ships, and read for what
docs/operations.md promises of them: readiness on /readyz, a preStop drain that fits the
grace period, a Service and a PodDisruptionBudget that select the Deployment's pods, and
the security settings (keys, the sandbox required, only the ingress trusted)."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def _documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def test_manifests_pass_strict_schema_validation() -> None:
    docs = _documents()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_the_validator_refuses_a_broken_deployment() -> None:
    """The check has teeth: a misspelt field and a wrong type are both refused."""
    deployment = _by_kind(_documents())["Deployment"]
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, latest_version(), strict=True)


def test_deployment_probes_drain_and_selectors_fit_together() -> None:
    kinds = _by_kind(_documents())
    deployment, service, budget = (
        kinds["Deployment"],
        kinds["Service"],
        kinds["PodDisruptionBudget"],
    )
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1

    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PARLEY_REDIS_URL"].startswith("redis+sentinel://")
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    # the pod is killed only after the preStop sleep and the whole drain grace
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > int(sleep[1]) + float(env["PARLEY_DRAIN_GRACE_S"])


def test_deployment_requires_the_sandbox_and_trusts_only_the_ingress() -> None:
    """The pods take API keys, refuse to start without the decoder's sandbox (`bwrap`, not
    `auto`), and trust X-Forwarded-For from a few addresses (the ingress controller's),
    not from a pod network: no range is wider than a /24 (IPv6: /120)."""
    container = _by_kind(_documents())["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PARLEY_API_KEYS_FILE"]
    assert env["PARLEY_UPLOAD_SANDBOX"] == "bwrap"
    trusted = [
        ipaddress.ip_network(item.strip(), strict=False)
        for item in env["PARLEY_TRUSTED_PROXIES"].split(",")
        if item.strip()
    ]
    assert trusted
    for network in trusted:
        assert network.num_addresses <= 256 and network.is_private, network
