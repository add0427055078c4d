"""Rule sets under version control: the services.

Every change to what a team's jobs are braked by is a new immutable ``RuleSetVersion``:

* ``change_rules``: an admin of the team changes its rules (the REST API, the settings page);
* ``change_default_pack``: a superuser changes the default pack (the Django admin), one version
  for every team whose rule set that changes;
* ``current_version``: a change made behind the console's back (a default-pack migration, a new
  ``BRAKELINE_EXECUTOR_GRACE_SECONDS`` or deadline at a restart, SQL) is found when the rule
  set is next read, and recorded as a version by the system. So no version ever describes
  rules other than the ones in force.

Numbering is per team and serialised by the team's row lock (``SELECT … FOR UPDATE``): two
admins saving at once get versions n and n+1, each diffed against the other's.

A version is *drilled* when every scenario covering one of its active rules passed a drill on
that version (``ruleset_core.drill_status``); the drills themselves are the drills package's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from breakers.detection import ruleset_core as core
from breakers.detection.engine import RuleSpec
from breakers.drills.scenarios import DRILL_SET, SCENARIOS
from breakers.models import DrillRun, DrillStatus, Rule, RuleSetVersion
from core.errors import Forbidden, InvalidInput
from incidents.models import Alert, Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

log = logging.getLogger(__name__)

OUTSIDE_CHANGE = (
    "Changed outside the console (a default-pack migration, a braking setting of the "
    "environment at a restart, or the database itself); recorded by the system."
)
FIRST_RECORDED = "The rule set in force when its versioning began; recorded by the system."
MAX_WHY = 2000


# --- Reading the rule set in force ----------------------------------------------------------


def braking_settings() -> dict[str, Any]:
    """The process settings braking depends on (README "Configuration"): how long the executor
    waits between the polite and the forced stop, and the deadlines that presume a job hung."""
    return {
        "executor_grace_seconds": float(settings.EXECUTOR_GRACE_SECONDS),
        "command_ack_timeout_seconds": {
            kind: float(seconds) for kind, seconds in settings.COMMAND_ACK_TIMEOUT_SECONDS.items()
        },
        "heartbeat_timeout_floor_seconds": float(settings.HEARTBEAT_TIMEOUT_FLOOR_SECONDS),
        "heartbeat_timeout_default_seconds": float(settings.HEARTBEAT_TIMEOUT_DEFAULT_SECONDS),
    }


def row_fields(row: Rule) -> dict[str, Any]:
    """A rule row as the dict ``ruleset_core`` works on."""
    return {name: getattr(row, name) for name in Rule.SPEC_FIELDS}


def _rows(team_id: int | None) -> tuple[dict[str, Rule], dict[str, Rule]]:
    """The default pack's rows and the team's rows, by key."""
    defaults: dict[str, Rule] = {}
    team: dict[str, Rule] = {}
    for row in Rule.objects.filter(Q(team__isnull=True) | Q(team_id=team_id)).order_by("pk"):
        (defaults if row.team_id is None else team)[row.key] = row
    return defaults, team


def rule_keys(team_ids: Iterable[int]) -> list[str]:
    """The rule keys that may raise an alert on these teams' jobs: the default pack's and the
    teams' own rules, and every key already seen on one of their alerts (the watchdog's and the
    control plane's own: heartbeat-timeout, a failed brake, …). What a silence can name."""
    teams = list(team_ids)
    rules = Rule.objects.filter(Q(team__isnull=True) | Q(team_id__in=teams))
    seen = Alert.objects.filter(job__team_id__in=teams)
    keys = set(rules.values_list("key", flat=True)) | set(seen.values_list("rule_key", flat=True))
    return sorted(keys)


def live_snapshot(team_id: int) -> dict[str, Any]:
    """The team's rule set as its jobs are evaluated with it now (as ``effective_rules``), in
    canonical form. A row that is not a valid rule is left out here as there."""
    defaults, team = _rows(team_id)
    rules = []
    for key in sorted(set(defaults) | set(team)):
        row = team.get(key) or defaults[key]
        try:
            spec = RuleSpec.from_dict(row_fields(row)).to_dict()
        except (ValueError, TypeError):
            continue
        origin = "default" if row.team_id is None else "override" if key in defaults else "team"
        rules.append({**spec, "origin": origin})
    return core.snapshot(rules, braking_settings())


# --- Appending a version ---------------------------------------------------------------------


def _lock(team_id: int) -> Team:
    return Team.objects.select_for_update().get(pk=team_id)


def _append(team: Team, actor: User | None, why: str) -> RuleSetVersion | None:
    """A new version of ``team`` if its rule set differs from its latest version's (the caller
    holds the team's row lock, inside its transaction); None when nothing changed."""
    snap = live_snapshot(team.pk)
    digest = core.fingerprint(snap)
    latest = RuleSetVersion.objects.filter(team=team).order_by("-number").first()
    if latest is not None and latest.fingerprint == digest:
        return None
    entries = core.diff(latest.snapshot if latest else None, snap)
    return RuleSetVersion.objects.create(
        team=team,
        number=(latest.number + 1) if latest else 1,
        created_at=timezone.now(),
        actor=actor,
        why=why,
        summary=core.summary(entries)[:300],
        diff=entries,
        snapshot=snap,
        fingerprint=digest,
    )


def current_version(team: Team) -> RuleSetVersion:
    """The team's latest version, recording first what changed outside the console since.

    The usual case (nothing changed) is two reads and no lock; the lock is taken only when the
    rule set in force differs from the latest version, and the check is repeated under it so
    two readers racing record one version, not two."""
    latest = RuleSetVersion.objects.filter(team=team).order_by("-number").first()
    if latest is not None and latest.fingerprint == core.fingerprint(live_snapshot(team.pk)):
        return latest
    with transaction.atomic():
        appended = _append(
            _lock(team.pk), None, FIRST_RECORDED if latest is None else OUTSIDE_CHANGE
        )
    if appended is not None:
        if appended.number > 1:
            log.warning("rules of team %s changed outside the console: v%s", team, appended.number)
        return appended
    return RuleSetVersion.objects.filter(team=team).order_by("-number")[0]


def describe_lines(version: RuleSetVersion) -> list[str]:
    """The version's diff, one sentence per rule or setting."""
    return core.describe(version.diff)


def _why(why: Any) -> str:
    if not isinstance(why, str) or not why.strip() or "\x00" in why or len(why) > MAX_WHY:
        raise InvalidInput(
            f"Say why the rules change (1–{MAX_WHY} characters).",
            fields={"why": "required: why the rules change"},
        )
    return why.strip()


def _parse(changes: Any) -> list[core.RuleChange]:
    try:
        return core.parse_changes(changes)
    except core.ChangeError as error:
        raise InvalidInput(str(error), fields={error.field: str(error)}) from None


def _write_rows(team_id: int | None, old: Mapping[str, Rule], new: Mapping[str, dict]) -> None:
    """Make the owner's rows ``new`` (key → fields): delete, update, create what differs."""
    for key in set(old) - set(new):
        old[key].delete()
    for key, fields in new.items():
        row = old.get(key) or Rule(team_id=team_id, key=key)
        if row.pk is not None and row_fields(row) == fields:
            continue
        for name, value in fields.items():
            setattr(row, name, value)
        row.save()


def change_rules(
    user: User, team_id: int, why: Any, changes: Any, *, context: AuditContext | None = None
) -> RuleSetVersion:
    """Create, edit, enable, disable or delete rules of a team (its admins), as one version.

    All or nothing: the changes are validated together (400 naming ``changes[i].…``) before a
    row is written, and rows and version commit in one transaction with the audit row."""
    with audited(user, Action.EDIT_RULES, "team", team_id, context) as attempt:
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.check(decide(role_in_team(user, team.pk), Action.EDIT_RULES))
        reason, parsed = _why(why), _parse(changes)
        with transaction.atomic():
            team = _lock(team.pk)
            current_version(team)  # an outside change gets its own version, not this one's diff
            defaults, rows = _rows(team.pk)
            try:
                new_rows = core.apply_changes(
                    {k: row_fields(r) for k, r in rows.items()},
                    {k: row_fields(r) for k, r in defaults.items()},
                    parsed,
                )
            except core.ChangeError as error:
                raise InvalidInput(str(error), fields={error.field: str(error)}) from None
            _write_rows(team.pk, rows, new_rows)
            version = _append(team, user, reason)
            if version is None:
                raise InvalidInput(
                    "These changes leave the rule set as it is.",
                    fields={"changes": "change nothing"},
                )
            attempt.succeeded(f"rule set of {team.name}: v{version.number}, {version.summary}")
    return version


def change_default_pack(
    user: User, why: Any, changes: Any, *, context: AuditContext | None = None
) -> list[RuleSetVersion]:
    """Change the default pack (superusers: the Django admin); a version for every team whose
    rule set that changes (a team that overrides the rule is not affected)."""
    with audited(user, Action.EDIT_RULES, "rule_pack", None, context) as attempt:
        if not getattr(user, "is_superuser", False):
            raise Forbidden("Only a superuser may change the default rule pack.")
        attempt.allowed, attempt.reason = True, "superuser"
        reason, parsed = _why(why), _parse(changes)
        with transaction.atomic():
            teams = list(Team.objects.select_for_update().order_by("pk"))  # one lock order
            for team in teams:
                current_version(team)
            defaults, _ = _rows(None)
            try:
                fields = {k: row_fields(r) for k, r in defaults.items()}
                new_rows = core.apply_changes(fields, {}, parsed)
            except core.ChangeError as error:
                raise InvalidInput(str(error), fields={error.field: str(error)}) from None
            _write_rows(None, defaults, new_rows)
            versions = [v for team in teams if (v := _append(team, user, reason)) is not None]
            attempt.succeeded(f"default pack: {len(versions)} team rule sets changed")
    return versions


# --- Drilled or not --------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillResults:
    coverage: Mapping[str, Iterable[str]] = field(default_factory=dict)  # scenario → rule keys
    passing: set[str] = field(default_factory=set)  # scenarios with a passing drill on it


def _drill_results(team: Team, version: int) -> DrillResults:
    """Which scenarios cover which rules, and which passed a drill on ``version`` of ``team``.

    The coverage is the full drill set's (``all``): every scenario, each verified end to end on
    every change of the project; a rule no scenario rehearses is "uncovered"."""
    coverage = {name: SCENARIOS[name].rules for name in DRILL_SET}
    return DrillResults(coverage, passing_scenarios(team, version))


def passing_scenarios(team: Team, ruleset_version: int | None) -> set[str]:
    """The scenarios with a passing drill of ``team`` on that rule-set version."""
    runs = DrillRun.objects.filter(
        team=team, status=DrillStatus.PASSED, ruleset_version=ruleset_version
    )
    return set(runs.values_list("scenario", flat=True).distinct())


def drills_url(team_id: int, scenarios: Iterable[str] = ()) -> str:
    """The team's drills page with the missing scenarios ticked (``?scenario=`` each): where
    the badge's "run the missing drills" leads."""
    query = urlencode([("scenario", name) for name in scenarios])
    return reverse("team-drills-page", args=[team_id]) + (f"?{query}" if query else "")


@dataclass(frozen=True)
class DrillBadge:
    team_id: int
    team: str
    version: int
    drilled: bool
    since: str  # "v7: loss-deviation changed (ana, 2026-12-02 05:10 UTC)"
    missing_scenarios: list[str]
    uncovered_rules: list[str]
    url: str


def drill_badge(team: Team) -> DrillBadge:
    version = current_version(team)
    results = _drill_results(team, version.number)
    status = core.drill_status(
        core.active_rules(version.snapshot), results.coverage, results.passing
    )
    who = version.actor.get_username() if version.actor else "system"
    when = version.created_at.strftime("%Y-%m-%d %H:%M UTC")
    return DrillBadge(
        team_id=team.pk,
        team=team.name,
        version=version.number,
        drilled=status.drilled,
        since=f"v{version.number}: {version.summary} ({who}, {when})",
        missing_scenarios=status.missing_scenarios,
        uncovered_rules=status.uncovered_rules,
        url=drills_url(team.pk, status.missing_scenarios),
    )


# --- The drill schedule ----------------------------------------------------------------------


@dataclass(frozen=True)
class DueDrill:
    team_id: int
    version: int
    scenarios: list[str]  # every scenario covering an active rule of the version
    idempotency_key: str  # one drill set per team, version and period, however often asked


def _drilled_since(team: Team, version: int, period: int) -> bool:
    """A drill of this version was queued in this period (by the schedule or a person): the
    schedule starts none, so the beat running twice or a retry starts each set once."""
    start = datetime.fromtimestamp(period * settings.DRILL_INTERVAL_SECONDS, tz=UTC)
    return DrillRun.objects.filter(
        team=team, ruleset_version=version, created_at__gte=start
    ).exists()


def due_drills(now: datetime | None = None) -> list[DueDrill]:
    """The scheduled drill sets due now: per team, every period of ``DRILL_INTERVAL_SECONDS``
    (default 30 days), the full drill set of its current version. Reading it twice in one
    period gives the same keys, so whoever starts the drills starts each set once."""
    now = now or timezone.now()
    period = core.schedule_period(now.timestamp(), settings.DRILL_INTERVAL_SECONDS)
    due = []
    for team in Team.objects.order_by("pk"):
        version = current_version(team)
        coverage = _drill_results(team, version.number).coverage
        active = set(core.active_rules(version.snapshot))
        scenarios = sorted(name for name, rules in coverage.items() if active & set(rules))
        if scenarios and not _drilled_since(team, version.number, period):
            key = f"drill-schedule:{team.pk}:v{version.number}:{period}"
            due.append(DueDrill(team.pk, version.number, scenarios, key))
    return due
