"""One error tree, rendered once at the edge.

Every error is a WSGI app: ``raise NotFound("...")`` inside, and the layer that
catches it does ``return exc(environ, start_response)``. The body is the API's
shape ``{"code_name": "...", "message": "..."}``, a Kubernetes ``Status``
object on tunnel paths (``bcs.error_style == "kubernetes"``) so kubectl prints
the message instead of a decoding error, or the source system's envelope
``{"result": false, "code": <bk-bcs error number>, "message": "...", "data": null}``
on the Mesos paths (``"bcs"``), which bcs clients and tools parse.

The bcs envelope keeps real HTTP statuses: bcs-api answered its Mesos errors
with HTTP 200 and only ``result``/``code`` said they failed; clients that read
the envelope are unaffected, and HTTP-aware ones no longer mistake a failure
for a success. Filter and admission failures on a driver stay the source's
400 (:attr:`BCSError.bcs_status`).

Messages are written for the client and must never contain a token or a
credential: callers build them from names and ids only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from enum import IntEnum
from typing import Any

from . import environ as env

# Kubernetes StatusReason values, by HTTP status (k8s.io/apimachinery metav1).
_K8S_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    501: "NotImplemented",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_PHRASES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class BcsCode(IntEnum):
    """bk-bcs error numbers (``bcs-common/common/errorCode.go``: 1405000 + n) for the bcs envelope."""

    HTTP_READ_BODY_FAIL = 1405006
    HTTP_PARAMETERS_FAILED = 1405007
    REQUEST_DATA_ERR = 1405008
    HTTP_DO = 1405009
    API_INTERNAL_FAIL = 1405050
    API_GET_MESOS_API_FAIL = 1405051
    API_REQUEST_MESOS_API_FAIL = 1405053
    API_AUTH_CHECK_FAIL = 1405057
    API_AUTH_CHECK_NO_AUTHORITY = 1405058
    API_UNAUTHORIZED = 1405059
    API_BAD_REQUEST = 1405061
    API_MEDIA_TYPE_ERROR = 1405065
    MESOS_DRIVER_COMMON = 1405230
    MESOS_DRIVER_HTTP_FILTER_FAILED = 1405234


# The bcs code an error gets when the raising code names none, by HTTP status.
_BCS_CODES = {
    400: BcsCode.HTTP_PARAMETERS_FAILED,
    401: BcsCode.API_AUTH_CHECK_FAIL,
    403: BcsCode.API_AUTH_CHECK_NO_AUTHORITY,
    404: BcsCode.API_GET_MESOS_API_FAIL,
    413: BcsCode.REQUEST_DATA_ERR,
    415: BcsCode.API_MEDIA_TYPE_ERROR,
    502: BcsCode.API_REQUEST_MESOS_API_FAIL,
    503: BcsCode.API_GET_MESOS_API_FAIL,
    504: BcsCode.API_REQUEST_MESOS_API_FAIL,
}


class BCSError(Exception):
    """Base of every error the project raises on purpose.

    :param message: human-readable, safe to show the client.
    :param code_name: SCREAMING_SNAKE name; defaults per subclass.
    :param headers: extra response headers (``WWW-Authenticate`` ...).
    :param bcs_code: the bk-bcs error number in the bcs envelope; by default one
        chosen by status (4xx parameters, 401/403 auth, 5xx internal...).
    """

    status = 500
    code_name = "INTERNAL_ERROR"
    #: the bk-bcs error number of the bcs envelope (``None``: chosen by status)
    bcs_code: int | None = None
    #: the HTTP status in the bcs style when it differs from :attr:`status`
    bcs_status: int | None = None
    #: On tunnel paths, answer with the message as text/plain instead of a Status:
    #: kubectl's discovery drops a Status's message and, for a 5xx other than 503,
    #: prints a text body ("an error on the server (\"...\") has prevented ...").
    kubernetes_text = False

    def __init__(
        self,
        message: str = "",
        *,
        code_name: str | None = None,
        status: int | None = None,
        headers: Iterable[tuple[str, str]] = (),
        bcs_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message or _PHRASES.get(self.status, "Error")
        if code_name is not None:
            self.code_name = code_name
        if status is not None:
            self.status = status
        if bcs_code is not None:
            self.bcs_code = bcs_code
        self.headers = list(headers)

    def body(self, style: env.ErrorStyle = "json") -> dict[str, Any]:
        if style == "bcs":
            code = self.bcs_code or _BCS_CODES.get(self.status, BcsCode.API_INTERNAL_FAIL)
            return {"result": False, "code": int(code), "message": self.message, "data": None}
        if style == "kubernetes":
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": self.message,
                "reason": _K8S_REASONS.get(self.status, "InternalError"),
                "details": {"causes": [{"reason": self.code_name, "message": self.message}]},
                "code": self.status,
            }
        return {"code_name": self.code_name, "message": self.message}

    def response_parts(
        self, style: env.ErrorStyle = "json"
    ) -> tuple[str, list[tuple[str, str]], bytes]:
        if style == "kubernetes" and self.kubernetes_text:
            payload, content_type = self.message.encode() + b"\n", "text/plain; charset=utf-8"
        else:
            payload, content_type = json.dumps(self.body(style)).encode(), "application/json"
        status = (self.bcs_status or self.status) if style == "bcs" else self.status
        status_line = f"{status} {_PHRASES.get(status, 'Error')}"
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(payload))),
            ("Cache-Control", "no-store"),
            *self.headers,
        ]
        return status_line, headers, payload

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        status_line, headers, payload = self.response_parts(env.get_error_style(environ))
        start_response(status_line, headers)
        return [payload]


class BadRequest(BCSError):
    status = 400
    code_name = "BAD_REQUEST"


class ValidationError(BadRequest):
    code_name = "VALIDATION_ERROR"


class MalformedBody(BadRequest):
    """A body that does not parse as the JSON or YAML it claims to be."""

    code_name = "INVALID_JSON"


class BodyTooDeep(BadRequest):
    """A JSON or YAML document nested deeper than :data:`bcs_middleware.core.bodies.MAX_DEPTH`."""

    code_name = "BODY_TOO_DEEP"


#: The challenge every 401 carries (RFC 6750 §3).
BEARER_CHALLENGE = ("WWW-Authenticate", 'Bearer realm="bcs-middleware"')


class Unauthorized(BCSError):
    status = 401
    code_name = "UNAUTHORIZED"

    def __init__(self, message: str = "authentication required", **kwargs: Any) -> None:
        kwargs.setdefault("headers", [BEARER_CHALLENGE])
        super().__init__(message, **kwargs)


class Forbidden(BCSError):
    status = 403
    code_name = "FORBIDDEN"


class NotFound(BCSError):
    status = 404
    code_name = "NOT_FOUND"


class MethodNotAllowed(BCSError):
    status = 405
    code_name = "METHOD_NOT_ALLOWED"


class Conflict(BCSError):
    status = 409
    code_name = "CONFLICT"


class PayloadTooLarge(BCSError):
    status = 413
    code_name = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(BCSError):
    status = 415
    code_name = "UNSUPPORTED_MEDIA_TYPE"


class InternalError(BCSError):
    status = 500
    code_name = "INTERNAL_ERROR"


class NotImplementedByServer(BCSError):
    status = 501
    code_name = "NOT_IMPLEMENTED"


class BadGateway(BCSError):
    status = 502
    code_name = "BAD_GATEWAY"


class UpstreamUnreachable(BadGateway):
    """The gateway could not reach or talk to an upstream; only superusers learn why.

    Which failure it was — refused, reset, timed out, not TLS, a certificate from
    another CA, refused by the address policy — tells the caller what listens at
    an address, and a cluster's addresses are chosen by whoever holds its register
    token: detailed answers would make the gateway a port scanner for any user.
    So everyone but a superuser gets one status and one message, the same bytes
    for every cause; superusers get ``detail`` (the typed error, rendered as
    usual). The detail names hosts, never a credential, and the layer that
    raises this logs it.

    :param detail: the error as the transport raised it.
    :param public_message: what everyone else reads.
    """

    code_name = "UPSTREAM_UNREACHABLE"

    def __init__(self, detail: BCSError, public_message: str = "cannot reach the upstream") -> None:
        super().__init__(public_message)
        self.detail = detail

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        user = env.get_user(environ)
        if user is not None and user.is_superuser:
            return self.detail(environ, start_response)
        return super().__call__(environ, start_response)


class TooManyRequests(BCSError):
    """A limit refused the request; retrying after ``retry_after`` seconds may succeed.

    As kube-apiserver answers it (apimachinery ``errors.NewTooManyRequests``): ``429``, a
    ``Retry-After`` header, and on tunnel paths a ``Status`` with reason ``TooManyRequests``
    and ``details.retryAfterSeconds`` — client-go and kubectl wait that long and retry
    (``rest/request.go``: ``checkWait``). The message names the limit, never the user.
    """

    status = 429
    code_name = "TOO_MANY_REQUESTS"

    def __init__(self, message: str, *, retry_after: int, limit: str) -> None:
        self.retry_after = max(1, retry_after)
        self.limit = limit
        super().__init__(message, headers=[("Retry-After", str(self.retry_after))])

    def body(self, style: env.ErrorStyle = "json") -> dict[str, Any]:
        body = super().body(style)
        if style == "kubernetes":
            body["details"]["retryAfterSeconds"] = self.retry_after
        elif style == "json":
            body.update(limit=self.limit, retry_after=self.retry_after)
        return body


class ServiceUnavailable(BCSError):
    status = 503
    code_name = "SERVICE_UNAVAILABLE"


class AgentUnavailable(ServiceUnavailable):
    """A cluster reached through its kube-agent's tunnel, and no agent connection to use.

    The message names the reason (not connected, gone, being replaced); it never
    names where the agent connects from.
    """

    code_name = "AGENT_UNAVAILABLE"


class ClusterNotReady(BCSError):
    """A cluster whose kube-agent has not reported yet: nothing to forward to.

    502, as text for kubectl: it prints such a body, while for a 503 it prints only
    "the server is currently unable to handle the request".
    """

    status = 502
    code_name = "CLUSTER_CREDENTIALS_MISSING"
    kubernetes_text = True


class GatewayTimeout(BCSError):
    status = 504
    code_name = "GATEWAY_TIMEOUT"


_UNEXPECTED = InternalError("internal error; see the server log")


def answer_unexpected(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """The answer to an exception no layer meant (call it from ``except``): logged with its
    traceback for the operator, ``500`` in the route's error style for the client — never
    the server's HTML page, which kubectl and bcs clients cannot read."""
    logging.getLogger("bcs_middleware.core.errors").exception(
        "unexpected error answering %s %r", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
    return _UNEXPECTED(environ, start_response)


class ConfigError(ValueError):
    """A configuration value is missing or wrong; raised at load time, never per request."""
