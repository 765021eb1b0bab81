"""The gevent worker's module loads no metrics: ``examples/gunicorn.conf.py`` imports it before it
sets ``PROMETHEUS_MULTIPROC_DIR``, and ``prometheus_client`` chooses its mode when first imported
(a metrics import there left ``/metrics`` empty under that config)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_worker_loads_no_metrics() -> None:
    code = ("import sys, bcs_middleware.serving.gevent_worker; "
            "print(sorted(m for m in sys.modules "
            "if m.startswith(('prometheus_client', 'bcs_middleware.telemetry.metrics'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
