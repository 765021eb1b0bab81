"""Sidecar injector: adds a logging sidecar container to every workload it sees.

The seeds' example webhook, speaking both the bcs protocol (whole object in
and out) and the Kubernetes AdmissionReview protocol (JSON patch)::

    bcs-middleware certs --service sidecar-injector --namespace bcs-system --out certs/
    python sidecar_injector.py --tls-cert-file certs/server.crt --tls-key-file certs/server.key

The container is added in the object's own shape: a Kubernetes container for a
Kubernetes object, a bcs v4 container (``apiVersion: v4`` Applications and
Deployments of Mesos clusters: ``command`` a string, ``args`` a list, CPU in
cores and memory in MiB, the ``type`` of the containers already there) for a bcs
one — a Kubernetes-shaped container is one the Mesos driver cannot read.

Objects annotated ``sidecar-injector/inject: "false"`` are left alone, and a
container already named ``sidecar`` is not added twice.
"""

from __future__ import annotations

from typing import Any

from webhook_kit import admission_app, is_bcs, main, pod_annotations, pod_spec

IMAGE = "busybox:1.36"
TAIL = "tail -F /var/log/app/*.log"
KUBERNETES_SIDECAR = {
    "name": "sidecar",
    "image": IMAGE,
    "command": ["sh", "-c", TAIL],
    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
}
# bcs-common/common/types/rc.go Container: command is one string, resources are cores and MiB.
BCS_SIDECAR = {
    "name": "sidecar",
    "image": IMAGE,
    "imagePullPolicy": "IfNotPresent",
    "command": "sh",
    "args": ["-c", TAIL],
    "resources": {"limits": {"cpu": "0.1", "memory": "64"}},
}


def inject_sidecar(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    if spec is None or pod_annotations(obj).get("sidecar-injector/inject") == "false":
        return
    containers = spec.setdefault("containers", [])
    if any(c.get("name") == "sidecar" for c in containers if isinstance(c, dict)):
        return
    if is_bcs(obj):
        kind = next((c["type"] for c in containers if isinstance(c, dict) and c.get("type")), "MESOS")
        containers.append({**BCS_SIDECAR, "type": kind, "args": list(BCS_SIDECAR["args"])})
    else:
        containers.append(dict(KUBERNETES_SIDECAR))
    pod_annotations(obj)["sidecar-injector/status"] = "injected"


app = admission_app(inject_sidecar)

if __name__ == "__main__":
    main(inject_sidecar, "sidecar injector admission webhook (bcs and Kubernetes protocols)")
