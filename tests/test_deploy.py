"""The container image and Kubernetes files, checked without a cluster, a helm binary or an
image builder: the Dockerfile linted statically, the Helm chart rendered by a small renderer
for the template subset it uses and compared with the static manifests, and the shipped
configuration accepted by llmsim's own loader."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmsim.config import load_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "llmsim"
STATIC = ROOT / "deploy" / "k8s"
_TAG = re.compile(r"(\s*)\{\{(-?)\s*(.*?)\s*-?\}\}", re.S)


def _lookup(ctx: dict[str, Any], path: str) -> Any:
    cur: Any = ctx
    for part in path.lstrip(".").split("."):
        cur = cur[part]
    return cur


def render(template: str, values: dict[str, Any]) -> str:
    """The Go-template subset the chart uses: ``{{ .Values.a.b }}``, ``| nindent N``,
    ``| indent N``, ``| quote``, and ``{{-`` trimming the whitespace before the tag."""
    ctx = {"Values": values, "Release": {"Name": "llmsim"}}

    def sub(m: re.Match[str]) -> str:
        lead, trim, expr = m.group(1), m.group(2), m.group(3)
        parts = [p.strip() for p in expr.split("|")]
        value: Any = _lookup(ctx, parts[0])
        for f in parts[1:]:
            name, *args = f.split()
            text = str(value).rstrip("\n")
            if name == "nindent":
                value = "\n" + "\n".join(" " * int(args[0]) + ln for ln in text.split("\n"))
            elif name == "indent":
                value = "\n".join(" " * int(args[0]) + ln for ln in text.split("\n"))
            elif name == "quote":
                value = f'"{text}"'
            else:
                raise AssertionError(f"template function {name} not supported by the test")
        return ("" if trim else lead) + str(value)

    return _TAG.sub(sub, template)


def _values(**over: Any) -> dict[str, Any]:
    v = yaml.safe_load((CHART / "values.yaml").read_text())
    for k, x in over.items():
        v[k] = x
    return v


def _chart(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for t in sorted((CHART / "templates").glob("*.yaml")):
        for doc in yaml.safe_load_all(render(t.read_text(), values)):
            out[doc["kind"]] = doc
    return out


def _static() -> dict[str, dict[str, Any]]:
    out = {}
    for f in sorted(STATIC.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            out[doc["kind"]] = doc
    return out


def test_chart_defaults_render_the_static_manifests() -> None:
    assert _chart(_values()) == _static()
    assert set(_static()) == {"ConfigMap", "Deployment", "Service"}


def test_every_object_is_well_formed_and_probes_hit_health() -> None:
    objs = _static()
    for kind, o in objs.items():
        assert o["apiVersion"] and o["kind"] == kind and o["metadata"]["name"] == "llmsim"
    pod = objs["Deployment"]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert c[probe]["httpGet"]["port"] in port
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert objs["Service"]["spec"]["selector"] == objs["Deployment"]["spec"]["selector"][
        "matchLabels"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["LLMSIM_PORT"] == str(port["http"]) == pod["metadata"]["annotations"][
        "prometheus.io/port"]


def test_shipped_config_is_accepted_by_llmsim(tmp_path: Path) -> None:
    objs = _static()
    toml_text = objs["ConfigMap"]["data"]["llmsim.toml"]
    tomllib.loads(toml_text)
    f = tmp_path / "llmsim.toml"
    f.write_text(toml_text)
    env = {e["name"]: e["value"] for e in
           objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    env["LLMSIM_CONFIG"] = str(f)
    cfg = load_config(env=env)  # unknown LLMSIM_* variables or keys would raise
    assert cfg.port == 8080 and cfg.max_tokens_mode == "cap"


def test_values_change_the_rendering() -> None:
    v = _values(replicas=7, config='latency = "instant"\nseed = 3\n')
    v["service"] = {**v["service"], "port": 9000}
    objs = _chart(v)
    assert objs["Deployment"]["spec"]["replicas"] == 7
    c = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["containerPort"] == 9000
    assert tomllib.loads(objs["ConfigMap"]["data"]["llmsim.toml"]) == {"latency": "instant",
                                                                     "seed": 3}
    with pytest.raises(KeyError):
        render("{{ .Values.nope }}", copy.deepcopy(v))


def test_dockerfile_lint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert froms and all("python:${PYTHON}" in f for f in froms)
    assert re.search(r"^ARG PYTHON=3\.1[1-9]-slim$", text, re.M)
    user = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"HEALTHCHECK .*\n?.*CMD .*?/health", text)
    assert 'ENTRYPOINT ["python", "-m", "llmsim"]' in text
    assert "LLMSIM_HOST=0.0.0.0" in text and "LLMSIM_PORT=8080" in text
    assert "EXPOSE 8080" in text
    assert '".${EXTRAS:+[$EXTRAS]}"' in text  # extras selectable by build arg
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".venv" in ignored
