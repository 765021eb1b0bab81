"""Agent tunnels: a cluster's agent dials out to the gateway, which reaches the apiserver through it.

* :mod:`.frames` — rancher/remotedialer's message framing (what the Go bcs-kube-agent speaks);
* :mod:`.wschannel` — binary WebSocket messages over one (TLS) socket;
* :mod:`.session` — many virtual TCP streams over one channel, with per-stream flow control;
* :mod:`.agent` — the agent side (``bcs-middleware kube-agent --tunnel``).
"""
