"""Admission layer cost: added latency per webhook call, and throughput when nothing matches.

    /work/venv/bin/python bench/admission_bench.py [--rounds 7] [--requests 200]

* Webhooks run in separate processes (the example sidecar injector behind
  werkzeug's threaded HTTPS server, certificates from trustme), so their CPU time
  does not share our GIL.
* "webhook own time" is a bare keep-alive HTTPS POST of the same body to the same
  webhook, measured in the same rounds; "per-call overhead" is
  ``(layer(N) - layer(0)) / N - own time``.
* Throughput compares the bare app with the layer in front of it for requests no
  definition matches (a GET, and a POST of another kind) — in-process, so only
  the layer's own cost is measured.

Contenders alternate within each round; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme
import urllib3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bcs_middleware.admission.client import WebhookClient  # noqa: E402
from bcs_middleware.admission.definitions import parse_bcs_definition  # noqa: E402
from bcs_middleware.admission.store import MemoryDefinitionStore  # noqa: E402
from bcs_middleware.layers.admission import AdmissionMiddleware  # noqa: E402
from tests.support.servers import free_port, wait_for_port  # noqa: E402

OBJ = {"apiVersion": "v4", "kind": "Deployment",
       "metadata": {"name": "web", "namespace": "prod"},
       "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}}}
BODY = json.dumps(OBJ).encode()


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def environ_for(method: str, body: bytes = b"") -> dict[str, Any]:
    return {"REQUEST_METHOD": method, "PATH_INFO": "/mesosdriver/v4/scheduler/namespaces/prod/deployments",
            "QUERY_STRING": "", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body), "SERVER_NAME": "x", "SERVER_PORT": "80",
            "wsgi.url_scheme": "http"}


def call(wsgi: Any, method: str, body: bytes = b"") -> None:
    status: list[str] = []
    result = wsgi(environ_for(method, body), lambda s, h, e=None: status.append(s))
    b"".join(result)
    if not status or not status[0].startswith("200"):
        raise RuntimeError(f"unexpected {status}")


def timed(fn: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--throughput-requests", type=int, default=20000)
    args = parser.parse_args()

    ca = trustme.CA()
    cert = ca.issue_cert("hook.bench", "127.0.0.1")
    tmp = Path(tempfile.mkdtemp(prefix="admission-bench-"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
    ca_b64 = base64.b64encode(ca.cert_pem.bytes()).decode()

    procs, ports = [], []
    for _ in range(3):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "examples/webhooks/sidecar_injector.py"), "--host", "127.0.0.1",
             "--port", str(port), "--tls-cert-file", str(tmp / "cert.pem"),
             "--tls-key-file", str(tmp / "key.pem")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT / "examples/webhooks")))
        ports.append(port)
    try:
        for port in ports:
            wait_for_port("127.0.0.1", port, 20)
        layers = {}
        for n in (0, 1, 3):
            webhooks = [{"name": f"h{i}", "failurePolicy": "Fail",
                         "clientConfig": {"caBundle": ca_b64, "url": f"https://127.0.0.1:{ports[i]}/"}}
                        for i in range(n)]
            store = MemoryDefinitionStore()
            if n:
                store.put_bcs(parse_bcs_definition({
                    "apiVersion": "v4", "kind": "admissionwebhook", "metadata": {"name": "bench"},
                    "resourcesRef": {"operation": "Create", "kind": "Deployment"},
                    "admissionWebhooks": webhooks}))
            layers[n] = AdmissionMiddleware(app, store=store, client=WebhookClient())
        # A definition exists for Create Deployment, but these requests do not match it.
        nomatch = layers[3]
        other_kind = json.dumps({**OBJ, "kind": "Application"}).encode()

        ctx = urllib3.util.ssl_.create_urllib3_context()
        ctx.load_verify_locations(cadata=ca.cert_pem.bytes().decode())
        raw_pools = [urllib3.HTTPSConnectionPool("127.0.0.1", p, ssl_context=ctx, maxsize=1) for p in ports]

        def raw_call() -> None:
            for pool in raw_pools:  # the three webhooks' own time, one after another
                r = pool.urlopen("POST", "/", body=BODY, headers={"Content-Type": "application/json"},
                                 retries=False)
                r.data

        for n in (0, 1, 3):  # warm pools
            call(layers[n], "POST", BODY)
        raw_call()

        latency: dict[str, list[float]] = {k: [] for k in ("raw3", "l0", "l1", "l3")}
        tput: dict[str, list[float]] = {k: [] for k in ("bare_get", "layer_get", "bare_post", "layer_post")}
        n_req, n_tp = args.requests, args.throughput_requests
        for _ in range(args.rounds):
            latency["raw3"].append(timed(raw_call, n_req) / 3)
            latency["l0"].append(timed(lambda: call(layers[0], "POST", BODY), n_req))
            latency["l1"].append(timed(lambda: call(layers[1], "POST", BODY), n_req))
            latency["l3"].append(timed(lambda: call(layers[3], "POST", BODY), n_req))
            tput["bare_get"].append(1 / timed(lambda: call(app, "GET"), n_tp))
            tput["layer_get"].append(1 / timed(lambda: call(nomatch, "GET"), n_tp))
            tput["bare_post"].append(1 / timed(lambda: call(app, "POST", other_kind), n_tp // 4))
            tput["layer_post"].append(1 / timed(lambda: call(nomatch, "POST", other_kind), n_tp // 4))
        med = {k: statistics.median(v) for k, v in {**latency, **tput}.items()}
        own = med["raw3"]
        print(f"rounds={args.rounds} requests/round={n_req} (medians)")
        print(f"webhook own time (bare keep-alive HTTPS POST): {own * 1e3:.3f} ms")
        for n in (0, 1, 3):
            print(f"through layer, {n} matching webhooks:        {med[f'l{n}'] * 1e3:.3f} ms")
        for n in (1, 3):
            per_call = (med[f"l{n}"] - med["l0"]) / n - own
            print(f"overhead per webhook call ({n} webhooks):     {per_call * 1e3:.3f} ms")
        for kind in ("get", "post"):
            bare, layer = med[f"bare_{kind}"], med[f"layer_{kind}"]
            print(f"no-match {kind.upper():4} throughput: bare {bare:,.0f}/s, layer {layer:,.0f}/s, "
                  f"cost {(1 - layer / bare) * 100:.1f}%")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
