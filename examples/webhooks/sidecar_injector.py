"""Sidecar injector: adds a logging sidecar container to every workload it sees.

The seeds' example webhook, speaking both the bcs protocol (whole object in
and out) and the Kubernetes AdmissionReview protocol (JSON patch)::

    bcs-middleware certs --service sidecar-webhook-service \\
        --namespace sidecar-webhook-namespace --out certs/
    python sidecar_injector.py --tls-cert-file certs/server.crt --tls-key-file certs/server.key

Objects annotated ``sidecar-injector/inject: "false"`` are left alone, and a
container already named ``sidecar`` is not added twice.
"""

from __future__ import annotations

from typing import Any

from webhook_kit import admission_app, main, pod_annotations, pod_spec

SIDECAR = {
    "name": "sidecar",
    "image": "busybox:1.36",
    "command": ["sh", "-c", "tail -F /var/log/app/*.log"],
    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
}


def inject_sidecar(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    if spec is None or pod_annotations(obj).get("sidecar-injector/inject") == "false":
        return
    containers = spec.setdefault("containers", [])
    if any(c.get("name") == SIDECAR["name"] for c in containers if isinstance(c, dict)):
        return
    containers.append(dict(SIDECAR))
    pod_annotations(obj)["sidecar-injector/status"] = "injected"


app = admission_app(inject_sidecar)

if __name__ == "__main__":
    main(inject_sidecar, "sidecar injector admission webhook (bcs and Kubernetes protocols)")
