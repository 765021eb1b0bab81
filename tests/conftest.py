"""Suite-wide rules.

Under ``CI=true`` a test that needs a real service (PostgreSQL, ZooKeeper,
kubectl, gunicorn) must run: a skip there turns into a failure, so a missing
install step in ``.ci/run`` can never pass silently.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"
