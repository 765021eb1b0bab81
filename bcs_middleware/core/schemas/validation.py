"""Validating bodies against the JSON Schemas shipped beside this module (see the package docstring)."""


from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ..errors import ValidationError


@cache
def load_schema(name: str) -> dict[str, Any]:
    text = resources.files("bcs_middleware.core.schemas").joinpath(f"{name}.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return schema


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


def field_path(path: Any) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "(body)"


def validate(name: str, instance: Any) -> None:
    """Raise ``ValidationError`` naming the first (most relevant) bad field."""
    error = best_match(validator(name).iter_errors(instance))
    if error is None:
        return
    where = field_path(error.absolute_path)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in (error.instance or {})]
        raise ValidationError(f"{where}: missing required field {missing[0]!r}" if missing
                              else f"{where}: missing required field")
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in (error.instance or {}) if k not in allowed)
        raise ValidationError(f"{where}: unknown field {extra[0]!r}" if extra
                              else f"{where}: unknown field")
    # The schema's own "description" reads better than jsonschema's text, which
    # would also quote the (possibly secret) value.
    hint = error.schema.get("description") if isinstance(error.schema, dict) else None
    kind = error.validator
    raise ValidationError(f"{where}: {hint or _generic(kind, error.validator_value)}")


def _generic(kind: Any, expected: Any) -> str:
    messages = {
        "type": f"must be of type {expected}",
        "minLength": f"must be at least {expected} characters",
        "maxLength": f"must be at most {expected} characters",
        "pattern": "has an invalid format",
        "enum": f"must be one of {expected}",
        "minimum": f"must be >= {expected}",
        "maximum": f"must be <= {expected}",
        "minItems": f"must have at least {expected} items",
        "maxItems": f"must have at most {expected} items",
        "format": f"must be a valid {expected}",
    }
    return messages.get(str(kind), f"is invalid ({kind})")
