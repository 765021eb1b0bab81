"""The ``bcs-middleware`` command: ``serve``, ``kube-agent``, certificates, admin tasks and the REST client."""
