"""Append-only records (timeline, audit trail, review revisions): one mechanism for all three.

Enforced three times: the model's save (of an existing row) and delete refuse, the queryset's
update, delete and bulk_update refuse, and on PostgreSQL a trigger installed by each model's
migration rejects UPDATE and DELETE from anyone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

from django.db import models


class AppendOnlyError(Exception):
    """An attempt to change or delete an append-only row: a record, never edited."""


def _refusal(model: type[models.Model], verb: str) -> AppendOnlyError:
    noun = getattr(model, "append_only_noun", "Records")
    return AppendOnlyError(f"{noun} are append-only: they cannot be {verb}.")


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs: Any) -> NoReturn:
        raise _refusal(self.model, "updated")

    def delete(self) -> NoReturn:
        raise _refusal(self.model, "deleted")

    # Refused before bulk_update opens its transaction (an error inside would doom the caller's).
    def bulk_update(
        self, objs: Iterable[Any], fields: Iterable[str], batch_size: int | None = None
    ) -> NoReturn:
        raise _refusal(self.model, "updated")

    # What Collector uses for fast deletes.
    def _raw_delete(self, using: str | None) -> NoReturn:
        raise _refusal(self.model, "deleted")


class AppendOnlyModel(models.Model):
    """Rows are inserted, never saved again nor deleted. Subclasses name their rows."""

    append_only_noun = "Records"

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise _refusal(type(self), "updated")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _refusal(type(self), "deleted")
