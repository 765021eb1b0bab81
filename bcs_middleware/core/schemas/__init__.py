"""JSON Schemas shipped as package data, loaded once, and one way to validate with them.

``validate("user_create", body)`` raises :class:`~bcs_middleware.core.errors.ValidationError`
whose message names the offending field (``server_addresses: ...``), so every 400
the API returns says what to fix. The offending *value* is never echoed: it may
be a credential.
"""
