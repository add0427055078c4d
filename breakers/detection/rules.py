"""The effective rule set of a job: the default pack, with its team's overrides and additions.

Rules are rows (``breakers.models.Rule``): team NULL for the default pack, a team's row with the
same key replaces the default rule for that team, a team's row with a new key adds one.

Building the rules (every row through ``Rule.to_spec``'s validation) was a quarter of the
worker's CPU per node bundle, and the rows change about never; so each process keeps
the rules it built per team, with the fingerprint of the rows it built them from: an md5, computed
by PostgreSQL, of the full text of every row the team's rules come from. Each call reads the
fingerprint (one small statement) and rebuilds only when it differs. Being a digest of the rows'
content, not a version number or a timestamp kept by the writers, it sees every way a row
changes: a rule-set change, the admin, a migration, an ``UPDATE`` typed in psql.
"""

from __future__ import annotations

import logging

from django.db import connection
from django.db.models import Q
from django.db.models.expressions import RawSQL

from breakers.detection.engine import RuleSpec
from breakers.detection.rulepack import default_rules
from breakers.models import Rule
from incidents.models import Job

log = logging.getLogger(__name__)

RULES = Rule._meta.db_table
# The rows of team {team} (an SQL expression) and the default pack, as one digest.
FINGERPRINT_SQL = (
    f"SELECT md5(string_agg(r::text, ',' ORDER BY r.id)) FROM {RULES} r "
    "WHERE r.team_id IS NULL OR r.team_id = {team}"
)
JOB_FINGERPRINT_SQL = (
    f"SELECT j.team_id, ({FINGERPRINT_SQL.format(team='j.team_id')}) "
    f"FROM {Job._meta.db_table} j WHERE j.id = %s"
)

# team id -> (fingerprint of its rows, the rules built from them); one entry per team.
_built: dict[int | None, tuple[str, list[RuleSpec]]] = {}


def effective_rules(team_id: int | None) -> list[RuleSpec]:
    """The rules a job of ``team_id`` is evaluated with (disabled ones included, marked so).

    A row that is not a valid rule (edited in SQL, bypassing the admin's validation) is
    logged and left out rather than stopping the evaluation of every other rule; logged when
    the rules are built, that is once per content of the rows, not on every evaluation.
    """
    if not _fingerprinted():
        return _build(team_id)[0]
    with connection.cursor() as cursor:
        cursor.execute(FINGERPRINT_SQL.format(team="%s"), [team_id])
        (fingerprint,) = cursor.fetchone()
    return _rules(team_id, fingerprint)


def rules_for_job(job_id: int) -> list[RuleSpec]:
    """The rules of the job's team, its team and their fingerprint read in one statement."""
    if not _fingerprinted():
        return effective_rules(Job.objects.values_list("team_id", flat=True).get(pk=job_id))
    with connection.cursor() as cursor:
        cursor.execute(JOB_FINGERPRINT_SQL, [job_id])
        found = cursor.fetchone()
    if found is None:
        raise Job.DoesNotExist(f"no job {job_id}")
    return _rules(*found)


def _fingerprinted() -> bool:
    """The digest is PostgreSQL's; the embedded mode (SQLite, one small console) builds the
    rules on every call, as it always did."""
    return connection.vendor == "postgresql"


def _rules(team_id: int | None, fingerprint: str | None) -> list[RuleSpec]:
    cached = _built.get(team_id)
    if fingerprint is not None and cached is not None and cached[0] == fingerprint:
        return list(cached[1])
    built, fingerprint = _build(team_id)
    if fingerprint is not None:
        _built[team_id] = (fingerprint, built)
    return list(built)


def _build(team_id: int | None) -> tuple[list[RuleSpec], str | None]:
    """The rules from the rows, and the fingerprint of those very rows: read in the same
    statement, so rules are never kept under the digest of rows other than theirs."""
    rows = Rule.objects.filter(Q(team__isnull=True) | Q(team_id=team_id))
    if _fingerprinted():
        rows = rows.annotate(fingerprint=RawSQL(FINGERPRINT_SQL.format(team="%s"), [team_id]))
    by_key: dict[str, Rule] = {}
    digest: str | None = None
    for row in rows.order_by("pk"):
        digest = getattr(row, "fingerprint", None)
        # A team's row wins over the default row with the same key, whatever the order.
        if row.team_id is not None or row.key not in by_key:
            by_key[row.key] = row
    specs = []
    for key, rule in by_key.items():
        try:
            specs.append(rule.to_spec())
        except (ValueError, TypeError) as error:
            log.error(
                "breaker rule %s (row %s) is invalid and not evaluated: %s", key, rule.pk, error
            )
    return specs, digest


def install_default_pack(rule_model: type[Rule] = Rule) -> int:
    """Create the default pack's rows that are missing (team NULL); returns how many.

    Create-only: a default rule an admin has edited is left as it is. Migration 0004 calls it
    with its historical model; a later pack change ships as a migration calling it again.
    """
    # Only the columns the (possibly historical) model has: a RuleSpec field added later must
    # not break this migration on a fresh database.
    columns = {field.name for field in rule_model._meta.get_fields()}
    created = 0
    for spec in default_rules():
        fields = {name: value for name, value in spec.to_dict().items() if name in columns}
        key = fields.pop("key")
        created += rule_model.objects.get_or_create(team=None, key=key, defaults=fields)[1]
    return created
