"""A float column that keeps NaN and ±Inf on every database we run on.

PostgreSQL's ``double precision`` stores NaN and ±Infinity natively. SQLite (the embedded mode)
silently turns a NaN REAL into NULL, which would erase exactly the signal L3 exists to catch,
so on SQLite NaN is stored as the text ``'NaN'`` (SQLite's type affinity keeps it as text)
and read back as a float.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import models


class NonFiniteFloatField(models.FloatField):
    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        value = super().get_db_prep_value(value, connection, prepared)
        if connection.vendor == "sqlite" and isinstance(value, float) and math.isnan(value):
            return "NaN"
        return value

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if isinstance(value, str):
            return float(value)
        return value
