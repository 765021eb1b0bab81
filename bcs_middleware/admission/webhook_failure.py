"""Why a webhook call gave no usable answer: :class:`WebhookCallError` and its causes.

A pure value of the admission model: the webhook client (:mod:`~bcs_middleware.admission.client`)
raises it for a call that failed, the review model (:mod:`~bcs_middleware.admission.review`) for
an answer the apiserver would refuse, and the engine decides by ``failurePolicy`` what it means.
"""

from __future__ import annotations

from typing import Literal

#: The metric label of a failure: ``timeout``, ``connect`` (no connection, or the address
#: policy refused the address), ``tls`` (the handshake or the certificate), ``status`` (not a
#: 200), ``malformed`` (an answer the apiserver would not accept), ``circuit_open`` (the
#: breaker did not call at all); and two the engine raises before a call: ``namespace`` (the
#: labels a ``namespaceSelector`` needs could not be read), ``budget`` (the request's total
#: admission budget was spent).
Cause = Literal["timeout", "connect", "tls", "status", "malformed", "circuit_open", "namespace", "budget"]


class WebhookCallError(Exception):
    """A webhook could not be called or answered badly.

    :param cause: one of :data:`Cause`.
    :param detail: safe to show a client: names, addresses and status codes only.
    :param webhook_fault: ``False`` for outcomes this request may have caused (a 4xx):
        they fail the request per its ``failurePolicy`` but do not count towards the breaker.
    """

    def __init__(self, cause: Cause, detail: str, *, webhook_fault: bool = True) -> None:
        super().__init__(detail)
        self.cause: Cause = cause
        self.detail = detail
        self.webhook_fault = webhook_fault
