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


class PostgresArrayField(models.Field):
    """An array column on PostgreSQL (``float8[]``, ``int8[]``…), plain text elsewhere.

    For tables written and read only through SQL on PostgreSQL (the compacted metric blocks):
    the embedded SQLite mode creates the column so the schema is the same, and never fills it.
    The ORM never converts these values; a query reads them with the driver's own arrays.
    """

    def __init__(self, *args: Any, element: str = "float8", **kwargs: Any) -> None:
        self.element = element
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple:
        name, path, args, kwargs = super().deconstruct()
        kwargs["element"] = self.element
        return name, path, args, kwargs

    def db_type(self, connection: Any) -> str:
        return f"{self.element}[]" if connection.vendor == "postgresql" else "text"
