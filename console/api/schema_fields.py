"""Serializer fields whose OpenAPI schema says what the wire really carries."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.nonfinite import DECODE, encode

NUMBER_OR_SPELLED: dict[str, Any] = {
    "oneOf": [
        {"type": "number"},
        {"type": "string", "enum": list(DECODE)},
    ],
    "description": 'A JSON number, or "NaN", "Infinity", "-Infinity" (non-finite values are '
    "data, spelled as strings because JSON has no literal for them).",
}


@extend_schema_field(NUMBER_OR_SPELLED)
class MetricValueField(serializers.Field):
    """A float that may be NaN or ±Infinity: written spelled out (core.nonfinite)."""

    def to_representation(self, value: float) -> float | str | None:
        return encode(value)

    def to_internal_value(self, data: Any) -> float:
        try:
            value = DECODE[data] if isinstance(data, str) else float(data)
        except (KeyError, TypeError, ValueError):
            raise serializers.ValidationError("a number, or NaN / Infinity / -Infinity") from None
        if isinstance(data, bool) or (math.isinf(value) and not isinstance(data, str)):
            raise serializers.ValidationError("a number, or NaN / Infinity / -Infinity")
        return value
