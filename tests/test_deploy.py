"""The container image and Kubernetes files, checked without a cluster, a helm binary or an
image builder: the Dockerfile and the image scripts linted statically, the Helm chart rendered
by a small renderer for the template subset it uses (with and without its optional Redis) and
compared with the static manifests, every object validated against the strict Kubernetes JSON
schemas (vendored, tests/data/k8s-schemas.json), and the shipped configuration accepted by
llmsim's own loader."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llmsim.config import load_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "llmsim"
STATIC = ROOT / "deploy" / "k8s"
_TAG = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_WORD = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')


class TemplateFail(Exception):
    """A template's ``{{ fail "..." }}``: helm refuses to render with this message."""


def _lookup(ctx: dict[str, Any], path: str) -> Any:
    cur: Any = ctx
    for part in path.lstrip(".").split("."):
        cur = cur[part]
    return cur


def _truthy(v: Any) -> bool:
    """Go template truth: false, 0, nil and empty strings or collections are false."""
    return v is not None and v is not False and v != 0 and v != "" and v != {} and v != []


def _pipeline(ctx: dict[str, Any], expr: str) -> Any:
    head, *filters = [p.strip() for p in expr.split("|")]

    def arg(w: str) -> Any:
        return json.loads(w) if w.startswith('"') else _lookup(ctx, w)

    fn, *args = _WORD.findall(head)
    if fn == "and":
        value: Any = all(_truthy(arg(a)) for a in args)
    elif fn == "not":
        value = not _truthy(arg(args[0]))
    elif fn == "fail":
        raise TemplateFail(arg(args[0]))
    else:
        assert not args, f"template function {fn} not supported by the test"
        value = arg(fn)
    for f in filters:
        name, *fargs = f.split()
        text = str(value).rstrip("\n")
        if name == "nindent":
            value = "\n" + "\n".join(" " * int(fargs[0]) + ln for ln in text.split("\n"))
        elif name == "indent":
            value = "\n".join(" " * int(fargs[0]) + ln for ln in text.split("\n"))
        elif name == "quote":
            value = json.dumps(text)
        else:
            raise AssertionError(f"template function {name} not supported by the test")
    return value


def render(template: str, values: dict[str, Any]) -> str:
    """The Go-template subset the chart uses: ``{{ .Values.a.b }}``, ``| nindent N``,
    ``| indent N``, ``| quote``, ``{{ if X }}…{{ else }}…{{ end }}`` with ``and``/``not``,
    ``{{ fail "msg" }}`` (raises :class:`TemplateFail`), and ``{{-``/``-}}`` trimming the
    whitespace before/after the tag."""
    ctx = {"Values": values, "Release": {"Name": "llmsim"}}
    tokens: list[tuple[str, str]] = []  # ("text", s) or ("tag", expression)
    pos, trim_next = 0, False
    for m in _TAG.finditer(template):
        text = template[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        tokens.append(("text", text))
        tokens.append(("tag", m.group(2)))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = template[pos:]
    tokens.append(("text", tail.lstrip() if trim_next else tail))

    def block(i: int, out: list[str] | None) -> tuple[int, str]:
        """Render tokens from ``i`` into ``out`` (None: skipped branch) up to a closing
        ``else``/``end`` (returned) or the end of the template."""
        while i < len(tokens):
            kind, s = tokens[i]
            i += 1
            if kind == "text":
                if out is not None:
                    out.append(s)
            elif s in ("else", "end"):
                return i, s
            elif s.startswith("if "):
                cond = out is not None and _truthy(_pipeline(ctx, s[3:]))
                i, closer = block(i, out if cond else None)
                if closer == "else":
                    i, closer = block(i, out if out is not None and not cond else None)
                assert closer == "end", "{{ if }} without {{ end }}"
            elif out is not None:
                out.append(str(_pipeline(ctx, s)))
        return i, ""

    out: list[str] = []
    _, closer = block(0, out)
    assert closer == "", f"unbalanced {{{{ {closer} }}}}"
    return "".join(out)


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


def _chart(values: dict[str, Any]) -> Objects:
    out: Objects = {}
    for t in sorted((CHART / "templates").glob("*.yaml")):
        docs = _docs(render(t.read_text(), values))
        assert not set(docs) & set(out), f"{t.name} redefines {set(docs) & set(out)}"
        out.update(docs)
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
    assert _chart(_values()) == _static()
    assert set(_static()) == {("ConfigMap", "llmsim"), ("Deployment", "llmsim"),
                              ("Service", "llmsim")}
    assert "LLMSIM_STATE" not in _env(_static())  # no shared state unless asked for


def test_chart_with_redis_renders_the_static_manifests_plus_redis_yaml() -> None:
    objs = _chart(_redis_values())
    want = _static("redis.yaml")
    assert set(objs) == set(want) == set(_static()) | {("Deployment", "llmsim-redis"),
                                                        ("Service", "llmsim-redis")}
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
    assert len(objs) == (5 if redis else 3)
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
    ("service.port", 70000), ("service.type", "Ingress"), ("name", "Bad_Name"),
    ("name", "x" * 58), ("image.pullPolicy", "Sometimes"), ("image.tag", "a b"),
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
    assert cfg.port == 8080 and cfg.max_tokens_mode == "cap"
    assert cfg.state == ("redis://llmsim-redis:6379/0" if redis else None)


def test_values_change_the_rendering() -> None:
    v = _values(replicas=7, config='latency = "instant"\nseed = 3\n', name="sim")
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
