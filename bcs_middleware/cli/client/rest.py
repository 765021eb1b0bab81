"""The REST client: JSON over HTTPS to one gateway, errors translated once.

A token never appears in what this module raises: errors carry the server's own
``code_name``/``message`` (which never hold secrets) or the name of the transport
failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import requests

#: Exit codes a script can tell apart (documented in the README).
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAUTHORIZED = 3
EXIT_FORBIDDEN = 4
EXIT_NOT_FOUND = 5
EXIT_CONFLICT = 6
_EXIT_BY_STATUS = {401: EXIT_UNAUTHORIZED, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}


class ClientError(Exception):
    """A failed call: what to print and the exit code scripts see."""

    def __init__(self, message: str, *, status: int | None = None, code_name: str | None = None,
                 exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code_name = code_name
        self.exit_code = exit_code

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.message} (HTTP {self.status}{' ' + self.code_name if self.code_name else ''})"


@dataclass(frozen=True)
class Connection:
    """:param server: the gateway's base URL (``https://host:port``).
    :param token: the bearer token (kept out of ``repr``).
    :param ca_file: the CA the gateway's certificate chains to; ``None`` uses the system's.
    :param timeout: seconds for connecting and for each read.
    """

    server: str
    token: str
    ca_file: str | None = None
    timeout: float = 30.0

    def __repr__(self) -> str:
        return f"Connection(server={self.server!r}, ca_file={self.ca_file!r})"


class GatewayClient:
    """``call(method, path, body)`` → the decoded JSON (or text) answer, or :class:`ClientError`."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy or netrc credentials from the environment
        self.session.verify = connection.ca_file or True
        self.session.headers["Authorization"] = f"Bearer {connection.token}"

    def call(self, method: str, path: str, body: Any = None, *, expect_json: bool = True) -> Any:
        response = self._request(method, path, body)
        if not expect_json:
            return response.text
        try:
            return response.json()
        except ValueError:
            raise ClientError(f"{method} {path}: the server did not answer JSON", status=response.status_code) from None

    def lines(self, path: str) -> Iterator[str]:
        """A text answer's lines as they arrive (a recording of any size is never held whole)."""
        response = self._request("GET", path, None, stream=True)
        with response:
            for line in response.iter_lines(chunk_size=64 * 1024, decode_unicode=False):
                yield line.decode("utf-8", "replace")

    def _request(self, method: str, path: str, body: Any, *, stream: bool = False) -> requests.Response:
        url = self.connection.server.rstrip("/") + path
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            response = self.session.request(method, url, data=data, headers=headers, stream=stream,
                                            timeout=self.connection.timeout, allow_redirects=False)
        except requests.exceptions.SSLError:
            raise ClientError(f"TLS verification of {self.connection.server} failed: is --ca-file the "
                              "gateway's CA?") from None
        except requests.exceptions.Timeout:
            raise ClientError(f"{self.connection.server} did not answer within {self.connection.timeout:g}s") from None
        except requests.exceptions.ConnectionError:
            raise ClientError(f"cannot connect to {self.connection.server}") from None
        except requests.exceptions.RequestException as exc:
            raise ClientError(f"request to {self.connection.server} failed: {type(exc).__name__}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response


def _error(response: requests.Response) -> ClientError:
    message, code_name = f"{response.reason or 'error'}", None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("message"), str):
            message = body["message"]
        code_name = body.get("code_name") if isinstance(body.get("code_name"), str) else body.get("reason")
    return ClientError(message, status=response.status_code, code_name=code_name,
                       exit_code=_EXIT_BY_STATUS.get(response.status_code, EXIT_ERROR))
