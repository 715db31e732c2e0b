"""Regenerate tests/data/k8s-schemas.json: the Kubernetes JSON schemas (strict: no unknown
fields) of the kinds deploy/ ships, cut down to the definitions they reach, descriptions
dropped. Source: the `kubernetes-validate` wheel from PyPI (Apache-2.0), which packages the
schemas generated from the Kubernetes OpenAPI spec:

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv
    python deploy/vendor-k8s-schemas.py /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

VERSION = "v1.37.0-local-strict"
KINDS = {"Deployment": "deployment-apps-v1.json", "Service": "service-v1.json",
         "ConfigMap": "configmap-v1.json",
         "PodDisruptionBudget": "poddisruptionbudget-policy-v1.json",
         "HorizontalPodAutoscaler": "horizontalpodautoscaler-autoscaling-v2.json",
         "NetworkPolicy": "networkpolicy-networking-v1.json"}
PREFIX = "/api/_definitions.json#/$defs/"
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "k8s-schemas.json"


def _clean(node: Any, refs: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "description" and isinstance(v, str):
                continue
            if k == "$ref":
                name = v.removeprefix(PREFIX).removeprefix("#/$defs/")
                refs.add(name)
                v = "#/$defs/" + name
            out[k] = _clean(v, refs)
        return out
    if isinstance(node, list):
        return [_clean(v, refs) for v in node]
    return node


def main(wheel: str) -> None:
    base = f"kubernetes_validate/kubernetes-json-schema/{VERSION}/"
    with zipfile.ZipFile(wheel) as z:
        defs = json.loads(z.read(base + "_definitions.json"))["$defs"]
        tops = {k: json.loads(z.read(base + f)) for k, f in KINDS.items()}
    out: dict[str, Any] = {}
    todo: set[str] = set()
    for kind, schema in tops.items():
        for k in ("$schema", "$id"):
            schema.pop(k, None)
        out[kind] = _clean(schema, todo)
    while todo:
        name = todo.pop()
        if name not in out:
            out[name] = _clean(defs[name], todo)
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema",
           "$comment": f"Kubernetes {VERSION} via kubernetes-validate (Apache-2.0); "
                       "regenerate with deploy/vendor-k8s-schemas.py",
           "$defs": dict(sorted(out.items()))}
    OUT.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"{OUT}: {len(out)} definitions, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1])
