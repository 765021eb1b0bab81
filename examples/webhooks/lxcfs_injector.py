"""lxcfs injector: mounts the lxcfs files over /proc so containers see their own limits.

The seeds' lxcfs-hostpath-injector, speaking both the bcs protocol and the
Kubernetes AdmissionReview protocol. Only workloads annotated
``sidecar-injector.lxcfs/inject: "true"`` are changed::

    python lxcfs_injector.py --tls-cert-file certs/server.crt --tls-key-file certs/server.key

A Kubernetes pod gets ``hostPath`` volumes and a ``volumeMount`` per container; a
bcs v4 pod (``apiVersion: v4``) has no pod volumes: each container gets the
bind mounts in its own ``volumes`` (``{"name", "volume": {"hostPath",
"mountPath", "readOnly"}}``, bcs-common's ``VolumeUnit``).
"""

from __future__ import annotations

from typing import Any

from webhook_kit import admission_app, is_bcs, main, pod_annotations, pod_spec

ANNOTATION = "sidecar-injector.lxcfs/inject"
STATUS = "sidecar-injector.lxcfs/status"
LXCFS_FILES = ("cpuinfo", "meminfo", "diskstats", "stat", "swaps", "uptime")


def inject_lxcfs(obj: dict[str, Any]) -> None:
    spec = pod_spec(obj)
    annotations = pod_annotations(obj)
    if spec is None or annotations.get(ANNOTATION) != "true" or annotations.get(STATUS):
        return
    containers = [c for c in spec.get("containers", []) if isinstance(c, dict)]
    if is_bcs(obj):
        for container in containers:
            container.setdefault("volumes", []).extend(
                {"name": f"lxcfs-proc-{name}",
                 "volume": {"hostPath": f"/var/lib/lxcfs/proc/{name}", "mountPath": f"/proc/{name}",
                            "readOnly": True}}
                for name in LXCFS_FILES)
    else:
        volumes = spec.setdefault("volumes", [])
        mounts = []
        for name in LXCFS_FILES:
            volume = f"lxcfs-proc-{name}"
            volumes.append({"name": volume,
                            "hostPath": {"path": f"/var/lib/lxcfs/proc/{name}", "type": "File"}})
            mounts.append({"name": volume, "mountPath": f"/proc/{name}", "readOnly": True})
        for container in containers:
            container.setdefault("volumeMounts", []).extend(dict(m) for m in mounts)
    annotations[STATUS] = "injected"


app = admission_app(inject_lxcfs)

if __name__ == "__main__":
    main(inject_lxcfs, "lxcfs injector admission webhook (bcs and Kubernetes protocols)")
