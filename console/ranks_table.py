"""The job page's ranks table, a page at a time: a job of a thousand ranks is read 50 rows per
request, sorted in SQL by what a person looks for (the silent first, the slowest, the furthest
behind), filtered by a rank number or a host, with the counts of the whole job on top.

A few small queries however many ranks: the counts (ranks and silent in one, stragglers),
the page's rows, and the straggler flags (the pace check's, ``breakers.pace``) of those rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, Case, Count, F, Q, QuerySet, Value, When
from django.utils import timezone

from breakers.models import RankPaceHistory
from incidents.models import Job, JobRank

PAGE_SIZE = 50
MISSING_NAMED = 16  # ranks never heard from, named; the rest counted
# Sort key → SQL ordering; the rank number breaks ties, so pages never overlap.
SORTS: dict[str, tuple[str, list[Any]]] = {
    "rank": ("rank", ["rank"]),
    "silent": ("silent first", [F("silent").desc(), "rank"]),
    "slowest": ("slowest", [F("step_time_seconds").desc(nulls_last=True), "rank"]),
    "behind": ("furthest behind", ["step", "rank"]),
}
DEFAULT_SORT = "silent"


@dataclass(frozen=True)
class RanksQuery:
    """What the person asked for, parsed: never an error, a bad value is the default."""

    sort: str = DEFAULT_SORT
    page: int = 1
    search: str = ""

    @classmethod
    def parse(cls, params: Any) -> RanksQuery:
        sort = params.get("sort", DEFAULT_SORT)
        raw_page = params.get("page", "1")
        page = int(raw_page) if raw_page.isdigit() and len(raw_page) < 9 else 1
        return cls(
            sort=sort if sort in SORTS else DEFAULT_SORT,
            page=max(page, 1),
            search=params.get("q", "").strip()[:64],
        )


@dataclass
class RanksPage:
    job_id: int
    world_size: int | None
    reported: int
    silent: int
    stragglers: int
    matching: int  # rows the search leaves
    query: RanksQuery
    pages: int
    rows: list[JobRank] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # never heard from, the first few
    missing_count: int = 0

    @property
    def sorts(self) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in SORTS.items()]

    @property
    def first(self) -> int:
        return (self.query.page - 1) * PAGE_SIZE + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


def _annotated(job_id: int, now: datetime) -> QuerySet[JobRank]:
    silent = Case(
        When(heartbeat_deadline__lt=now, then=Value(True)),
        default=Value(False),
        output_field=BooleanField(),
    )
    return JobRank.objects.filter(job_id=job_id).annotate(silent=silent)


def _searched(rows: QuerySet[JobRank], search: str) -> QuerySet[JobRank]:
    """A rank number, else part of a host name."""
    if not search:
        return rows
    if search.isdigit() and len(search) < 10:
        return rows.filter(rank=int(search))
    return rows.filter(hostname__icontains=search)


def ranks_page(job_id: int, query: RanksQuery, now: datetime | None = None) -> RanksPage:
    """One page of the job's ranks with the whole job's counts (see the module doc)."""
    now = now or timezone.now()
    all_rows = _annotated(job_id, now)
    counts = all_rows.aggregate(
        reported=Count("pk"), silent=Count("pk", filter=Q(heartbeat_deadline__lt=now))
    )
    stragglers = RankPaceHistory.objects.filter(job_id=job_id, flagged=True).count()
    world_size = Job.objects.filter(pk=job_id).values_list("world_size", flat=True).first()
    found = _searched(all_rows, query.search)
    matching = found.count() if query.search else counts["reported"]
    pages = max(1, -(-matching // PAGE_SIZE))
    query = RanksQuery(query.sort, min(query.page, pages), query.search)
    start = (query.page - 1) * PAGE_SIZE
    rows = list(found.order_by(*SORTS[query.sort][1])[start : start + PAGE_SIZE])
    flagged = set(
        RankPaceHistory.objects.filter(
            job_id=job_id, flagged=True, rank__in=[r.rank for r in rows]
        ).values_list("rank", flat=True)
    )
    for row in rows:
        row.straggler = row.rank in flagged  # type: ignore[attr-defined]
    missing, missing_count = _missing(job_id, world_size, counts["reported"])
    return RanksPage(
        job_id=job_id,
        world_size=world_size,
        reported=counts["reported"],
        silent=counts["silent"],
        stragglers=stragglers,
        matching=matching,
        query=query,
        pages=pages,
        rows=rows,
        missing=missing,
        missing_count=missing_count,
    )


def _missing(job_id: int, world_size: int | None, reported: int) -> tuple[list[int], int]:
    """Ranks below the world size that never heartbeated: the first few, and how many."""
    if not world_size or reported >= world_size:
        return [], max(0, (world_size or 0) - reported)
    seen = set(
        JobRank.objects.filter(job_id=job_id, rank__lt=world_size).values_list("rank", flat=True)
    )
    missing = [r for r in range(world_size) if r not in seen]
    return missing[:MISSING_NAMED], len(missing)
