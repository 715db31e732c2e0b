"""The container image and Kubernetes files, checked without a cluster, a helm binary or an
image builder: the Dockerfile and the image scripts linted statically, the Helm chart rendered
by a small renderer for the template subset it uses (tests/helmrender.py: no helm binary
installs from the registries CI reaches) under several releases and values, compared with
the static manifests, every object validated against the strict Kubernetes JSON schemas
(vendored, tests/data/k8s-schemas.json), every pod checked against Pod Security
"restricted", the server run on a read-only root, and the shipped configuration accepted by
llmsim's own loader."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llmsim.config import load_config

from .helmrender import Chart, TemplateFail

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "llmsim"
CHART_T = Chart(CHART)
STATIC = ROOT / "deploy" / "k8s"
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
"""What the chart adds that the static manifests (applied with kubectl) do not claim."""


def _values(**over: Any) -> dict[str, Any]:
    v = yaml.safe_load((CHART / "values.yaml").read_text())
    for k, x in over.items():
        v[k] = x
    return v


Objects = dict[tuple[str, str], dict[str, Any]]  # (kind, metadata.name) -> object
SCHEMAS = json.loads((ROOT / "tests" / "data" / "k8s-schemas.json").read_text())
OPTIONAL = STATIC / "optional"  # applied only when wanted (not by `kubectl apply -f deploy/k8s/`)


def _docs(text: str) -> Objects:
    out: Objects = {}
    for doc in yaml.safe_load_all(text):
        if doc is not None:  # a template whose {{ if }} is off renders to nothing
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} defined twice"
            out[key] = doc
    return out


def _chart(values: dict[str, Any], release: str = "llmsim") -> Objects:
    out: Objects = {}
    for name, text in CHART_T.render(values, release).items():
        docs = _docs(text)
        assert not set(docs) & set(out), f"{name} redefines {set(docs) & set(out)}"
        out.update(docs)
    return out


def render(template: str, values: dict[str, Any]) -> str:
    return CHART_T.render_string(template, values)


def _unhelm(objs: Objects) -> Objects:
    """The chart's objects as the static manifests have them: without Helm's own labels and
    the config checksum (a kubectl apply of a changed ConfigMap does not restart pods)."""
    out = copy.deepcopy(objs)
    for o in out.values():
        metas = [o["metadata"]]
        if "template" in o.get("spec", {}):
            metas.append(o["spec"]["template"]["metadata"])
        for m in metas:
            for k in HELM_ONLY_LABELS:
                m.get("labels", {}).pop(k, None)
            m.get("annotations", {}).pop("checksum/config", None)
    return out


def _static(*optional: str) -> Objects:
    out: Objects = {}
    for f in [*sorted(STATIC.glob("*.yaml")), *(OPTIONAL / name for name in optional)]:
        out.update(_docs(f.read_text()))
    return out


def _env(objs: Objects, name: str = "llmsim") -> dict[str, str]:
    c = objs["Deployment", name]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in c["env"]}


def _schema_errors(o: dict[str, Any]) -> list[str]:
    v = jsonschema.Draft202012Validator({**SCHEMAS, "$ref": "#/$defs/" + o["kind"]})
    return [f"{o['kind']}/{o['metadata']['name']}: {e.json_path}: {e.message}"
            for e in v.iter_errors(o)]


def _redis_values(**over: Any) -> dict[str, Any]:
    v = _values(**over)
    v["redis"] = {**v["redis"], "enabled": True}
    return v


def test_chart_defaults_render_the_static_manifests() -> None:
    assert _unhelm(_chart(_values())) == _static()
    assert set(_static()) == {("ConfigMap", "llmsim"), ("Deployment", "llmsim"),
                              ("Service", "llmsim"), ("PodDisruptionBudget", "llmsim")}
    assert "LLMSIM_STATE" not in _env(_static())  # no shared state unless asked for


def test_chart_with_redis_renders_the_static_manifests_plus_redis_yaml() -> None:
    objs = _unhelm(_chart(_redis_values()))
    want = _static("redis.yaml")
    assert set(objs) == set(want) == set(_static()) | {("Deployment", "llmsim-redis"),
                                                        ("Service", "llmsim-redis"),
                                                        ("NetworkPolicy", "llmsim-redis")}
    # the only difference from the static files: the env line redis.yaml says to `set env`
    env = _env(objs)
    assert env.pop("LLMSIM_STATE") == "redis://llmsim-redis:6379/0"
    assert env == _env(want)
    objs["Deployment", "llmsim"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        e for e in objs["Deployment", "llmsim"]["spec"]["template"]["spec"]["containers"][0][
            "env"] if e["name"] != "LLMSIM_STATE"]
    assert objs == want
    assert "LLMSIM_STATE=redis://llmsim-redis:6379/0" in (OPTIONAL / "redis.yaml").read_text()
    svc = want["Service", "llmsim-redis"]
    assert svc["spec"]["ports"][0]["port"] == 6379
    assert svc["spec"]["selector"] == want["Deployment", "llmsim-redis"]["spec"]["selector"][
        "matchLabels"] != want["Deployment", "llmsim"]["spec"]["selector"]["matchLabels"]
    args = want["Deployment", "llmsim-redis"]["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert args[:4] == ["--save", "", "--appendonly", "no"]  # no persistence


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is absent")
def test_redis_accepts_the_rendered_arguments(tmp_path: Path) -> None:
    """The chart's Redis command line, run by a real redis-server: no persistence, the
    memory cap applied."""
    c = _chart(_redis_values())["Deployment", "llmsim-redis"]["spec"]["template"]["spec"][
        "containers"][0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", *c["args"], "--port", str(port), "--bind",
                             "127.0.0.1", "--dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[0]  # refused its arguments
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        with conn:
            conn.sendall(b"CONFIG GET maxmemory\r\nCONFIG GET save\r\nCONFIG GET appendonly\r\n")
            buf = b""
            while buf.count(b"\r\n") < 15:
                chunk = conn.recv(4096)
                assert chunk, buf
                buf += chunk
        lines = buf.decode().split("\r\n")[:-1]  # RESP: *2, then $len + value per word
        words = [w for w in lines if not w.startswith(("*", "$"))]
        assert words == ["maxmemory", str(256 * 1024 * 1024), "save", "", "appendonly", "no"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_external_state_url_and_the_conflict() -> None:
    v = _values()
    v["state"] = {"url": "redis://redis.example:6379/2"}
    assert _values_errors(v) == []
    objs = _chart(v)
    assert _env(objs)["LLMSIM_STATE"] == "redis://redis.example:6379/2"
    assert ("Deployment", "llmsim-redis") not in objs
    v["redis"] = {**v["redis"], "enabled": True}
    with pytest.raises(TemplateFail, match="not both"):
        _chart(v)


@pytest.mark.parametrize("redis", [False, True])
def test_every_object_matches_the_kubernetes_schema(redis: bool) -> None:
    """Strict Kubernetes 1.37 schemas (vendored: tests/data/k8s-schemas.json): a misspelt or
    misplaced field fails here as `kubectl apply --validate=strict` would."""
    objs = _chart(_redis_values() if redis else _values())
    assert len(objs) == (7 if redis else 4)
    assert [e for o in objs.values() for e in _schema_errors(o)] == []
    assert _schema_errors(_static("redis.yaml")["Service", "llmsim-redis"]) == []
    bad = copy.deepcopy(objs["Deployment", "llmsim"])
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pth"] = "/"
    bad["spec"]["replicas"] = "2"
    errs = _schema_errors(bad)
    assert len(errs) == 2 and "'pth' was unexpected" in " ".join(errs)  # the check can fail


def _values_errors(v: dict[str, Any]) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    return [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(v)]


def _set(v: dict[str, Any], path: str, x: Any) -> dict[str, Any]:
    v = copy.deepcopy(v)
    *head, last = path.split(".")
    cur = v
    for k in head:
        cur = cur[k]
    cur[last] = x
    return v


@pytest.mark.parametrize(("path", "bad"), [
    ("replicas", -1), ("replicas", "2"), ("replicas", 10**6), ("service.port", 0),
    ("service.port", 70000), ("service.type", "Ingress"), ("fullnameOverride", "Bad_Name"),
    ("fullnameOverride", "x" * 58), ("image.pullPolicy", "Sometimes"), ("image.tag", "a b"),
    ("resources.limits.memory", "lots"), ("resources.requests.cpu", -1),
    ("redis.enabled", "yes"), ("redis.enable", True), ("redis.maxmemory", "256 MB"),
    ("redis.maxmemory", "0"), ("state.url", "r" * 2049), ("state", "redis://x:6379/0"),
    ("config", 3), ("config", "x" * 1_000_001), ("replica", 2),
])
def test_values_schema_bounds_every_value(path: str, bad: Any) -> None:
    """values.schema.json: helm refuses these before rendering (a typo'd key included)."""
    assert _values_errors(_values()) == [] and _values_errors(_redis_values()) == []
    assert _values_errors(_set(_values(), path, bad)), (path, bad)


def test_every_object_is_well_formed_and_probes_hit_health() -> None:
    objs = _static()
    for (kind, name), o in objs.items():
        assert o["apiVersion"] and o["kind"] == kind and name == "llmsim"
    pod = objs["Deployment", "llmsim"]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert c[probe]["httpGet"]["port"] in port
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert objs["Service", "llmsim"]["spec"]["selector"] == objs["Deployment", "llmsim"][
        "spec"]["selector"]["matchLabels"]
    env = _env(objs)
    assert env["LLMSIM_PORT"] == str(port["http"]) == pod["metadata"]["annotations"][
        "prometheus.io/port"]
    assert env["LLMSIM_CONFIG"].startswith(c["volumeMounts"][0]["mountPath"] + "/")


@pytest.mark.parametrize("redis", [False, True])
def test_shipped_config_is_accepted_by_llmsim(tmp_path: Path, redis: bool) -> None:
    objs = _chart(_redis_values() if redis else _values())
    toml_text = objs["ConfigMap", "llmsim"]["data"]["llmsim.toml"]
    tomllib.loads(toml_text)
    f = tmp_path / "llmsim.toml"
    f.write_text(toml_text)
    env = _env(objs)
    env["LLMSIM_CONFIG"] = str(f)
    unknown: list[str] = []  # an unknown LLMSIM_* variable warns (unknown keys raise)
    cfg = load_config(env=env, warn=unknown.append)
    assert unknown == []
    assert cfg.port == 8080 and cfg.max_tokens_mode == "natural"
    assert cfg.state == ("redis://llmsim-redis:6379/0" if redis else None)


def test_values_change_the_rendering() -> None:
    v = _values(replicas=7, config='latency = "instant"\nseed = 3\n', fullnameOverride="sim")
    v["service"] = {**v["service"], "port": 9000}
    v["redis"] = {**v["redis"], "enabled": True, "maxmemory": "1gb"}
    assert _values_errors(v) == []
    objs = _chart(v)
    assert objs["Deployment", "sim"]["spec"]["replicas"] == 7
    c = objs["Deployment", "sim"]["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["containerPort"] == 9000
    assert _env(objs, "sim")["LLMSIM_STATE"] == "redis://sim-redis:6379/0"
    assert ("Service", "sim-redis") in objs
    assert objs["Deployment", "sim-redis"]["spec"]["template"]["spec"]["containers"][0][
        "args"][-1] == "1gb"
    assert tomllib.loads(objs["ConfigMap", "sim"]["data"]["llmsim.toml"]) == {
        "latency": "instant", "seed": 3}
    with pytest.raises(KeyError):
        render("{{ .Values.nope }}", copy.deepcopy(v))


def test_renderer_subset() -> None:
    v = {"a": True, "b": "", "s": 'x "y"', "n": 0}
    assert render("{{ if .Values.a }}A{{ else }}B{{ end }}", v) == "A"
    assert render("{{ if .Values.b }}A{{ else }}B{{ end }}", v) == "B"
    assert render("{{ if and .Values.a .Values.n }}A{{ end }}|{{ if not .Values.b }}C{{ end }}",
                  v) == "|C"
    assert render("x\n  {{- .Values.s | quote -}}  \ny", v) == 'x"x \\"y\\""y'
    assert render("{{ if .Values.b }}{{ fail \"no\" }}{{ end }}ok", v) == "ok"
    with pytest.raises(AssertionError):
        render("{{ if .Values.a }}open", v)


def test_renderer_more_of_the_subset() -> None:
    v = {"m": {"k": "v"}, "e": {}, "l": ["a"], "name": "rel-x"}
    assert render("{{- with .Values.m }}m:{{ toYaml . | nindent 2 }}{{ end }}", v) == "m:\n  k: v"
    assert render("{{ with .Values.e }}E{{ else }}none{{ end }}", v) == "none"
    assert render('{{ if eq .Values.name "x" }}1{{ else if contains "rel" .Values.name }}2'
                  '{{ else }}3{{ end }}', v) == "2"
    assert render('{{ printf "%s-%s" .Values.name "y" | trunc 5 | trimSuffix "-" }}', v) == \
        "rel-x"
    assert render('{{ printf "%s-%s" .Values.name "y" | trunc 4 | trimSuffix "-" }}', v) == \
        "rel"
    assert render("{{ .Values.name | sha256sum }}", v) == __import__("hashlib").sha256(
        b"rel-x").hexdigest()
    assert render('{{ default "d" .Values.e }}|{{/* a comment */}}{{ .Chart.Name }}', v) == \
        "d|llmsim"
    with pytest.raises(AssertionError, match="without toYaml"):
        render("{{ .Values.l }}", v)
    with pytest.raises(AssertionError, match="not supported"):
        render("{{ .Values.name | upper }}", v)
    with pytest.raises(TemplateFail, match="no"):
        render('{{ fail "no" }}', v)


# -- release names, labels, Pod Security "restricted" -----------------------------------------

def _pods(objs: Objects) -> list[tuple[str, dict[str, Any]]]:
    return [(name, o["spec"]["template"]) for (kind, name), o in objs.items()
            if kind == "Deployment"]


SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security Standards' "restricted" profile (baseline's rules included), as the
    PodSecurity admission controller checks a pod template; plus the read-only root
    filesystem this chart promises."""
    spec = pod["spec"]
    psc = spec.get("securityContext", {})
    out: list[str] = []
    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            out.append(f"{f} is set")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: type {kinds} not allowed")
    for sc in psc.get("sysctls", []):
        if sc["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sc['name']}")
    if spec.get("securityContext", {}).get("windowsOptions", {}).get("hostProcess"):
        out.append("hostProcess")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"pod seccompProfile {pod_seccomp}")
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext", {})
        n = c["name"]
        if sc.get("privileged"):
            out.append(f"{n}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{n}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{n}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{n}: adds capabilities {caps['add']}")
        if not (sc.get("runAsNonRoot") or (psc.get("runAsNonRoot") and
                                           sc.get("runAsNonRoot") is not False)):
            out.append(f"{n}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{n}: runAsUser 0")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{n}: seccompProfile {seccomp}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{n}: procMount")
        se = {**psc.get("seLinuxOptions", {}), **sc.get("seLinuxOptions", {})}
        if se.get("type", "container_t") not in ("container_t", "container_init_t",
                                                 "container_kvm_t", "container_engine_t") \
                or se.get("user") or se.get("role"):
            out.append(f"{n}: seLinuxOptions")
        if sc.get("appArmorProfile", {}).get("type", "RuntimeDefault") == "Unconfined":
            out.append(f"{n}: appArmor Unconfined")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{n}: hostPort")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{n}: root filesystem is writable")
    return out


@pytest.mark.parametrize("redis", [False, True])
def test_pods_meet_pod_security_restricted(redis: bool) -> None:
    objs = _chart(_redis_values() if redis else _values())
    for name, pod in _pods(objs):
        assert restricted_violations(pod) == [], name
        assert pod["spec"]["automountServiceAccountToken"] is False
    for name, pod in _pods(_static("redis.yaml")):
        assert restricted_violations(pod) == [], name
    # the checker can fail: each relaxation is named
    pod = copy.deepcopy(objs["Deployment", "llmsim"]["spec"]["template"])
    c = pod["spec"]["containers"][0]
    del c["securityContext"]["capabilities"]
    c["securityContext"]["readOnlyRootFilesystem"] = False
    pod["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    pod["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    pod["spec"]["securityContext"]["runAsUser"] = 0
    v = restricted_violations(pod)
    for needle in ("drop ALL", "root filesystem", "seccompProfile Unconfined", "hostPath",
                   "runAsUser 0"):
        assert any(needle in x for x in v), (needle, v)


def test_two_releases_get_distinct_names_and_selectors() -> None:
    a, b = _chart(_redis_values(), "llmsim"), _chart(_redis_values(), "team-b")
    names_a = {name for _kind, name in a}
    names_b = {name for _kind, name in b}
    assert names_a == {"llmsim", "llmsim-redis"}
    assert names_b == {"team-b-llmsim", "team-b-llmsim-redis"}
    sel = [o["spec"]["selector"]["matchLabels"] for objs in (a, b)
           for (kind, _n), o in objs.items() if kind == "Deployment"]
    assert len({tuple(sorted(s.items())) for s in sel}) == 4  # no pod matches two selectors
    assert _env(b, "team-b-llmsim")["LLMSIM_STATE"] == "redis://team-b-llmsim-redis:6379/0"
    assert b["Service", "team-b-llmsim"]["spec"]["selector"] == b[
        "Deployment", "team-b-llmsim"]["spec"]["selector"]["matchLabels"]
    assert b["PodDisruptionBudget", "team-b-llmsim"]["spec"]["selector"]["matchLabels"] == b[
        "Deployment", "team-b-llmsim"]["spec"]["selector"]["matchLabels"]
    assert b["Deployment", "team-b-llmsim"]["spec"]["template"]["spec"]["volumes"][0][
        "configMap"]["name"] == "team-b-llmsim"
    labels = b["Deployment", "team-b-llmsim"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "team-b"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["helm.sh/chart"] == "llmsim-0.2.0"
    assert _chart(_values(), "my-llmsim-2")  # contains the chart name: used as is
    assert ("Deployment", "my-llmsim-2") in _chart(_values(), "my-llmsim-2")
    long = _chart(_redis_values(), "r" * 53)  # helm's longest release name
    for (_kind, name), o in long.items():
        assert len(name) <= 63 and not name.endswith("-"), name
        assert _schema_errors(o) == []


def test_network_policies() -> None:
    objs = _chart(_redis_values(), "team-b")
    np = objs["NetworkPolicy", "team-b-llmsim-redis"]
    assert _schema_errors(np) == []
    redis_pods = objs["Deployment", "team-b-llmsim-redis"]["spec"]["template"]["metadata"][
        "labels"]
    server_pods = objs["Deployment", "team-b-llmsim"]["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= redis_pods.items()
    peer = np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert peer.items() <= server_pods.items() and not peer.items() <= redis_pods.items()
    assert np["spec"]["ingress"][0]["ports"] == [{"port": 6379, "protocol": "TCP"}]
    other = _chart(_redis_values(), "team-c")["Deployment", "team-c-llmsim"]["spec"][
        "template"]["metadata"]["labels"]
    assert not peer.items() <= other.items()  # another release's llmsim is not let in
    v = _values()
    assert not [k for k in _chart(v) if k[0] == "NetworkPolicy"]  # off unless asked
    v["networkPolicy"] = {"enabled": True, "from": [{"namespaceSelector": {
        "matchLabels": {"team": "load"}}}]}
    assert _values_errors(v) == []
    own = _chart(v)["NetworkPolicy", "llmsim"]
    assert _schema_errors(own) == []
    assert own["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}],
                                       "from": v["networkPolicy"]["from"]}]


def test_config_checksum_restarts_pods_on_a_config_change() -> None:
    def checksum(v: dict[str, Any]) -> str:
        return _chart(v)["Deployment", "llmsim"]["spec"]["template"]["metadata"][
            "annotations"]["checksum/config"]

    a = checksum(_values())
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    assert checksum(_values()) == a != checksum(_values(config='latency = "instant"\n'))
    assert checksum(_values(replicas=5)) == a  # only the config moves it


def test_scheduling_and_pod_values_render_and_validate() -> None:
    v = _values(
        nodeSelector={"kubernetes.io/arch": "amd64"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                "labelSelector": {"matchLabels": {
                                                    "app.kubernetes.io/name": "llmsim"}}}}]}},
        imagePullSecrets=[{"name": "regcred"}],
        podAnnotations={"example.com/team": "infra"}, podLabels={"team": "infra"},
        resources={"requests": {"cpu": "1", "memory": "512Mi"},
                   "limits": {"cpu": "4", "memory": "2Gi"}})
    v["redis"] = {**v["redis"], "enabled": True}
    assert _values_errors(v) == []
    objs = _chart(v)
    for (_kind, _name), o in objs.items():
        assert _schema_errors(o) == []
    for name, pod in _pods(objs):
        spec = pod["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64"}, name
        assert spec["tolerations"][0]["key"] == "gpu" and spec["imagePullSecrets"] == [
            {"name": "regcred"}]
        assert "podAntiAffinity" in spec["affinity"]
    pod = objs["Deployment", "llmsim"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["example.com/team"] == "infra"
    assert pod["metadata"]["labels"]["team"] == "infra"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "2Gi"}
    bad = _set(v, "tolerations", [{"key": "gpu", "operatr": "Exists"}])
    errs = [e for o in _chart(bad).values() for e in _schema_errors(o)]
    assert errs and "'operatr' was unexpected" in " ".join(errs)  # Kubernetes' schema checks


def test_autoscaling_and_service_monitor() -> None:
    v = _values()
    v["autoscaling"] = {**v["autoscaling"], "enabled": True, "maxReplicas": 6}
    v["serviceMonitor"] = {**v["serviceMonitor"], "enabled": True,
                           "labels": {"release": "prometheus"}}
    assert _values_errors(v) == []
    objs = _chart(v, "prod")
    hpa = objs["HorizontalPodAutoscaler", "prod-llmsim"]
    assert _schema_errors(hpa) == []
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "prod-llmsim"}
    assert hpa["spec"]["maxReplicas"] == 6
    assert "replicas" not in objs["Deployment", "prod-llmsim"]["spec"]  # the HPA owns it
    sm = objs["ServiceMonitor", "prod-llmsim"]  # a CRD: no vendored schema, checked here
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= objs[
        "Service", "prod-llmsim"]["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert objs["Service", "prod-llmsim"]["spec"]["ports"][0]["name"] == "http"
    for bad in (("autoscaling.minReplicas", 0), ("serviceMonitor.interval", "soon"),
                ("podDisruptionBudget.maxUnavailable", "half"),
                ("imagePullSecrets", [{"nam": "x"}]), ("nodeSelector", {"a": 1})):
        assert _values_errors(_set(v, *bad)), bad
    off = _values()
    off["podDisruptionBudget"] = {**off["podDisruptionBudget"], "enabled": False}
    assert ("PodDisruptionBudget", "llmsim") not in _chart(off)


def _read_only_root_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        "mount -o remount,bind,ro / && ! touch /.llmsim-ro-probe"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.mark.skipif(not _read_only_root_works(),
                    reason="needs root and unshare to mount / read-only in a namespace")
def test_server_runs_on_a_read_only_root() -> None:
    """The chart's readOnlyRootFilesystem: llmsim (two workers: their shared store is on
    disk) serves with / mounted read-only and only /tmp writable, as the pod's emptyDir."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the writable tmpfs on its own mount point, made before / goes read-only (not over /tmp:
    # the checkout and its virtualenv may live there), and TMPDIR pointed at it
    script = ("d=$(mktemp -d) && mount -t tmpfs -o size=64m tmpfs \"$d\" && "
              "mount -o remount,bind,ro / && "
              f"TMPDIR=\"$d\" exec {shlex.quote(sys.executable)} -m llmsim --port {port} "
              "--workers 2 --latency instant --quiet")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "llmsim did not start"
                time.sleep(0.1)
        body = json.dumps({"model": "gpt-4o", "input": "hi", "store": True}).encode()
        req = urllib.request.Request(url + "/v1/responses", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            rid = json.loads(r.read())["id"]
        for _ in range(4):  # any worker finds it: the shared store under /tmp works
            with urllib.request.urlopen(f"{url}/v1/responses/{rid}", timeout=30) as r:
                assert json.loads(r.read())["id"] == rid
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "Read-only file system" not in out, out


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
    extras = re.search(r'^ARG EXTRAS="([a-z,]*)"$', text, re.M)
    assert extras and "redis" in extras.group(1).split(",")  # the chart's redis.enabled works
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".venv" in ignored and ".coverage*" in ignored


@pytest.mark.parametrize("script", ["build-image.sh", "image-smoke.sh"])
def test_deploy_scripts_lint(script: str) -> None:
    """The image scripts cannot run in CI (no Docker Hub for the base image): kept parseable
    by bash and clean under shellcheck where it is installed."""
    path = ROOT / "deploy" / script
    assert os.access(path, os.X_OK)
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout
    text = path.read_text()
    assert "set -euo pipefail" in text and "docker info" in text  # a CLI without a daemon
    if script == "build-image.sh":  # buildah/podman default to OCI format, which drops
        assert "--format docker" in text  # the HEALTHCHECK
