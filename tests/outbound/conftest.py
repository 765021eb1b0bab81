"""Fixtures shared with the proxy's tests: a CA and a fake TLS upstream (defined in ``tests/apps/conftest.py``)."""

from tests.apps.conftest import ca, fake_tls

__all__ = ["ca", "fake_tls"]
