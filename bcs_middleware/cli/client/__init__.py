"""``bcs-middleware`` as a client of a gateway's management REST API.

* :mod:`.rest` — one small HTTP client (``requests``, the gateway CA, a timeout on every
  call) and the one place its errors become :class:`~.rest.ClientError`;
* :mod:`.settings` — the server, CA and token from flags, environment or the config
  file ``login`` writes;
* :mod:`.kubeconfig` — merging contexts into a kubeconfig without touching others;
* :mod:`.output` — tables, JSON and YAML;
* :mod:`.commands` — the subcommands and their ``--help``.
"""
