"""An issuer's keys: one issuer that hangs never holds up another's fetch (a lock per issuer)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import trustme

from bcs_middleware.authn.config import Issuer
from bcs_middleware.authn.keys import IssuerKeys, KeysUnavailable
from bcs_middleware.outbound.transport import PooledTransport
from tests.support.polling import wait_until

HANG = 3.0


def test_a_hung_issuers_fetch_never_holds_up_another_issuers() -> None:
    ca_pem = trustme.CA().cert_pem.bytes().decode()
    transport = PooledTransport(connect_timeout=HANG, read_timeout=HANG)
    with socket.socket() as hang, socket.socket() as gone:
        hang.bind(("127.0.0.1", 0))
        hang.listen(8)  # connections complete in the backlog; nothing ever answers on them
        gone.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused at once
        hung = IssuerKeys(Issuer(f"https://127.0.0.1:{hang.getsockname()[1]}", ("a",), certificate_authority=ca_pem),
                          transport, timeout=HANG)
        down = IssuerKeys(Issuer(f"https://127.0.0.1:{gone.getsockname()[1]}", ("a",), certificate_authority=ca_pem),
                          transport, timeout=HANG)
        errors: list[str] = []

        def fetch_hung() -> None:
            try:
                hung.keys()
            except KeysUnavailable as exc:
                errors.append(str(exc))

        waiting = threading.Thread(target=fetch_hung)
        waiting.start()
        try:
            assert wait_until(lambda: hung.fetches > 0, timeout=10, step=0.01)  # it holds its lock
            started = time.monotonic()
            with pytest.raises(KeysUnavailable, match="fetching the discovery document failed"):
                down.keys()
            # Refused at once: it never waited for the hung issuer's lock.
            assert time.monotonic() - started < HANG / 3
        finally:
            waiting.join(HANG * 4)
    assert errors and "timed out" in errors[0]

