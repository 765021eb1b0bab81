"""Permission subscription: grants from an auth system → Kubernetes RBAC bindings on every cluster.

* :mod:`.model` — the data format, its validation and the bindings it implies;
* :mod:`.sources` — :class:`FileSource` and :class:`HTTPSource` (ETag polling);
* :mod:`.reconciler` — makes a cluster's owned bindings match, scheduling with backoff;
* :mod:`.leader` — one reconciler per deployment (a lease in the store);
* :mod:`.service` — :class:`RBACService`, the background runner;
* :mod:`.api` — ``GET /rest/rbac/status``.
"""
