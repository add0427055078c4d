"""Compare-and-swap status transitions, shared by every stateful model.

Each stateful model has one status column and an explicit table of allowed transitions. A
transition is applied as ``UPDATE … SET status = new WHERE pk = … AND status = expected``: zero
rows updated means somebody else changed the row first, and the caller lost the race. That is
how two workers, or two managers clicking at the same moment, are kept from both "winning".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models


class InvalidTransition(Exception):
    """A transition that the model's table does not allow (a programming error or bad input)."""


def check_allowed(table: Mapping[str, Iterable[str]], expected: Iterable[str], new: str) -> None:
    for current in expected:
        if new not in table.get(current, ()):
            raise InvalidTransition(f"status {current!r} cannot become {new!r}")


def compare_and_swap(
    model: type[models.Model],
    pk: Any,
    *,
    table: Mapping[str, Iterable[str]],
    expected: Iterable[str],
    new: str,
    field: str = "status",
    **other_fields: Any,
) -> bool:
    """Move row ``pk`` from one of ``expected`` to ``new``; True if this call won."""
    expected = list(expected)
    check_allowed(table, expected, new)
    updated = model._default_manager.filter(pk=pk, **{f"{field}__in": expected}).update(
        **{field: new}, **other_fields
    )
    return updated == 1


def compare_and_swap_all(
    rows: models.QuerySet,
    *,
    table: Mapping[str, Iterable[str]],
    expected: Iterable[str],
    new: str,
    field: str = "status",
    **other_fields: Any,
) -> int:
    """The bulk form: every row of ``rows`` still in one of ``expected`` becomes ``new`` in one
    UPDATE; returns how many did (rows another writer moved first are left as they are)."""
    expected = list(expected)
    check_allowed(table, expected, new)
    return rows.filter(**{f"{field}__in": expected}).update(**{field: new}, **other_fields)
