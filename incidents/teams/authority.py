"""Who may do what to a team's jobs: Brakeline's one policy module.

Pure Python on purpose (no Django import): the REST API, the UI, the breaker engine and the
audit trail all ask ``decide()``, so they can never disagree, and the whole matrix is tested
cell by cell in milliseconds. ``docs/authority-matrix.md`` is generated from ``MATRIX``.

Vocabulary
- role: a person's role in the job's team, ``"viewer" < "oncall" < "manager" < "admin"``, or
  ``None`` when they have no role in that team (then they may do nothing, not even view).
- ``"system"`` (``SYSTEM``): the automatic actor (the breakers). It is not a team role and has
  no rank; it may only do the automatic actions of the severity table (docs/design.md
  "Severity levels").
- level: the severity of the alert the action concerns (``"L1"``..``"L4"``), or ``None`` when
  there is no alert (a person acting on a job on their own initiative).

Unknown roles, actions or levels raise ``ValueError``: they are programming errors, and a
silent deny would hide them.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Role(enum.StrEnum):
    """A person's role in one team, lowest first."""

    VIEWER = "viewer"
    ONCALL = "oncall"
    MANAGER = "manager"
    ADMIN = "admin"


# The automatic actor. Deliberately not a Role: it has no rank, so ``role_at_least`` can never
# hand it a person's authority by accident.
SYSTEM = "system"

ROLE_ORDER: tuple[Role, ...] = (Role.VIEWER, Role.ONCALL, Role.MANAGER, Role.ADMIN)
_RANK: Mapping[Role, int] = MappingProxyType({role: rank for rank, role in enumerate(ROLE_ORDER)})


class Level(enum.StrEnum):
    """Alert severity (docs/design.md "Severity levels")."""

    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"


# Every level an action can be asked about; None means "no alert".
LEVELS: tuple[Level | None, ...] = (None, Level.L1, Level.L2, Level.L3, Level.L4)


class Action(enum.StrEnum):
    """Everything the policy answers for. Values are stable: they appear in audit rows."""

    VIEW = "view"
    ACKNOWLEDGE_ALERT = "acknowledge_alert"
    SNOOZE_ALERT = "snooze_alert"
    ASSIGN_INCIDENT = "assign_incident"
    NOTE_INCIDENT = "note_incident"
    PAUSE_JOB = "pause_job"
    CONFIRM_PAUSE = "confirm_pause"
    REQUEST_ESCALATION = "request_escalation"
    APPROVE_ESCALATION = "approve_escalation"
    REJECT_ESCALATION = "reject_escalation"
    APPLY_MITIGATION = "apply_mitigation"
    RESUME_JOB = "resume_job"
    TERMINATE_JOB = "terminate_job"
    ISOLATE_NODE = "isolate_node"
    EDIT_REVIEW = "edit_review"
    CREATE_JOB = "create_job"
    MANAGE_SHIFTS = "manage_shifts"
    MANAGE_SILENCES = "manage_silences"
    EDIT_RULES = "edit_rules"
    RUN_DRILL = "run_drill"
    MANAGE_MEMBERS = "manage_members"
    MANAGE_NOTIFICATIONS = "manage_notifications"


# Actions that decide someone's request: the requester may never be the decider.
REQUEST_DECISIONS: frozenset[Action] = frozenset(
    {Action.APPROVE_ESCALATION, Action.REJECT_ESCALATION}
)

# Control-plane command kinds (docs/design.md "The control plane") and the action that
# authorises them.
COMMAND_ACTIONS: Mapping[str, Action] = MappingProxyType(
    {
        "lower_lr": Action.APPLY_MITIGATION,
        "pause_data": Action.APPLY_MITIGATION,
        "checkpoint_and_pause": Action.PAUSE_JOB,
        "resume": Action.RESUME_JOB,
        "terminate": Action.TERMINATE_JOB,
        "isolate_node": Action.ISOLATE_NODE,
        "inject_fault": Action.RUN_DRILL,  # drill sandboxes only (breakers.drills)
    }
)


@dataclass(frozen=True)
class Cell:
    """Who may do one action at one level."""

    minimum_role: Role | None  # lowest team role allowed; None: no person at all
    system: bool = False  # the automatic actor may do it, without waiting for anyone
    why_nobody: str = ""  # when minimum_role is None: the reason, shown in the refusal


@dataclass(frozen=True)
class ActionPolicy:
    """One row group of the matrix: an action, its cells per level, and why."""

    phrase: str  # completes "may ..." in reasons, e.g. "pause a job"
    cells: Mapping[Level | None, Cell]
    rationale: str  # the design decision, rendered into docs/authority-matrix.md

    def __post_init__(self) -> None:
        missing = set(LEVELS) - set(self.cells)
        if missing:
            raise ValueError(f"{self.phrase!r}: no cell for levels {missing}")
        # Read-only, so nobody can widen the policy at run time by mutating a shared dict.
        object.__setattr__(self, "cells", MappingProxyType(dict(self.cells)))

    @property
    def people_depend_on_level(self) -> bool:
        """Whether a person's answer changes with the level (the system's may differ alone)."""
        return len({(cell.minimum_role, cell.why_nobody) for cell in self.cells.values()}) > 1


@dataclass(frozen=True)
class Decision:
    """The answer: allowed or not, and a sentence fit for a 403 body and an audit row."""

    allowed: bool
    reason: str
    required_role: str | None  # lowest team role that could do it here; None: no person
    action: str
    role: str | None
    level: str | None


def _same_everywhere(
    minimum: Role | None, *, system_at: tuple[Level, ...] = ()
) -> dict[Level | None, Cell]:
    return {level: Cell(minimum, system=level in system_at) for level in LEVELS}


def _nobody(why: str) -> Cell:
    return Cell(None, why_nobody=why)


_CONFIRM_OUTSIDE_L3 = Cell(Role.MANAGER)

MATRIX: Mapping[Action, ActionPolicy] = MappingProxyType(
    {
        Action.VIEW: ActionPolicy(
            "see this team's jobs, alerts, incidents and reviews",
            _same_everywhere(Role.VIEWER),
            "Every team member may look; a person with no role in the team may not even view. "
            "The system does not need to view anything.",
        ),
        Action.ACKNOWLEDGE_ALERT: ActionPolicy(
            "acknowledge an alert",
            _same_everywhere(Role.ONCALL),
            "Acknowledging stops the unacknowledged-alert escalation to the manager, so it "
            "needs someone who will act: on-call and above. Viewers only look.",
        ),
        Action.SNOOZE_ALERT: ActionPolicy(
            "snooze an alert's pages",
            _same_everywhere(Role.ONCALL),
            "One alert's pages wait a bounded while (at most 4 hours) without acknowledging it: "
            "the person being paged asks for the time to look, so on-call and above. Unlike a "
            "silence it covers one alert and cannot outlast a night; like a silence it holds "
            "pages only, never a brake (the automatic L3/L4 actions still fire).",
        ),
        Action.ASSIGN_INCIDENT: ActionPolicy(
            "assign an incident",
            _same_everywhere(Role.ONCALL),
            "Take an incident, or hand it to another on-call engineer, manager or admin of the "
            "team: saying who handles it changes no job, so whoever may acknowledge may do it.",
        ),
        Action.NOTE_INCIDENT: ActionPolicy(
            "write a note on an incident",
            _same_everywhere(Role.ONCALL),
            "Notes (timestamped, signed, append-only on the timeline and in the review) are "
            "written by the people who handle the incident, as the review is. Viewers read.",
        ),
        Action.PAUSE_JOB: ActionPolicy(
            "pause a job",
            _same_everywhere(Role.ONCALL, system_at=(Level.L3,)),
            "Checkpoint and pause. On-call may pause any job of their team at once, at any level "
            "or with no alert at all: a pause keeps a consistent checkpoint, and waiting is what "
            "the product exists to remove. The system pauses automatically on L3.",
        ),
        Action.CONFIRM_PAUSE: ActionPolicy(
            "confirm a pause",
            {
                None: _CONFIRM_OUTSIDE_L3,
                Level.L1: _CONFIRM_OUTSIDE_L3,
                Level.L2: _CONFIRM_OUTSIDE_L3,
                Level.L3: Cell(Role.ONCALL, system=True),
                Level.L4: _nobody(
                    "an L4 job is terminated, not paused, so there is no pause to confirm"
                ),
            },
            "Keep paused, resume, or roll back to a named checkpoint. The design (docs/design.md) "
            "gives on-call the confirmation of the automatic L3 pause with all three outcomes, "
            "including resume: "
            "the breaker acted without a person, so the person on "
            "duty must be able to undo a false alarm at once. Any other pause (one a person "
            "asked for, or an approved L2 escalation) ends only by a manager's decision, "
            "because resuming is a manager's call everywhere else. The system confirms an "
            "automatic L3 pause only as a roll back to the last clean checkpoint, and only when "
            "the braking rule's recovery policy says recover automatically (docs/recovery.md).",
        ),
        Action.REQUEST_ESCALATION: ActionPolicy(
            "request an escalation",
            {
                None: _nobody(
                    "an escalation is requested on an alert; without one, pause the job directly"
                ),
                Level.L1: Cell(Role.ONCALL),
                Level.L2: Cell(Role.ONCALL),
                Level.L3: _nobody(
                    "the breaker has already paused the job; confirm the pause instead"
                ),
                Level.L4: _nobody("the breaker has already terminated the job"),
            },
            "An escalation asks for an action stronger than the rule's soft mitigation (e.g. a "
            "pause or a larger LR cut) and takes effect only once a manager approves it. "
            "On-call and above request escalations on L2 alerts (docs/design.md) and also on L1: "
            "a manager still has to approve, so allowing it adds no authority. On L3 and L4 "
            "the system has already acted, so there is nothing left to escalate.",
        ),
        Action.APPROVE_ESCALATION: ActionPolicy(
            "approve an escalation request",
            _same_everywhere(Role.MANAGER),
            "Managers and admins approve, never the requester themselves. "
            "Not tied to the level: a pending request must stay decidable when its alert "
            "changes level meanwhile.",
        ),
        Action.REJECT_ESCALATION: ActionPolicy(
            "reject an escalation request",
            _same_everywhere(Role.MANAGER),
            "Same authority as approving, for the same reasons: rejecting is the other half "
            "of the same decision.",
        ),
        Action.APPLY_MITIGATION: ActionPolicy(
            "apply a soft mitigation",
            _same_everywhere(Role.MANAGER, system_at=(Level.L2,)),
            "Lower the learning rate or pause data loading. The system applies the rule's soft "
            "mitigation automatically on L2. A person "
            "needs manager rank to issue one directly (a manager could approve it anyway); "
            "on-call goes through an escalation request.",
        ),
        Action.RESUME_JOB: ActionPolicy(
            "resume a job",
            _same_everywhere(Role.MANAGER),
            "Managers resume jobs (docs/design.md). On-call resumes only by confirming an L3 pause "
            "(confirm_pause). The system never resumes on this action: its only resume is the "
            "roll back of an automatic L3 pause that a rule's recovery policy allows "
            "(confirm_pause).",
        ),
        Action.TERMINATE_JOB: ActionPolicy(
            "terminate a job",
            _same_everywhere(Role.MANAGER, system_at=(Level.L4,)),
            "Managers terminate jobs (docs/design.md). The system terminates automatically on L4, "
            "where no approval is ever waited for.",
        ),
        Action.ISOLATE_NODE: ActionPolicy(
            "isolate a node of a job",
            _same_everywhere(Role.MANAGER, system_at=(Level.L4,)),
            "The system isolates faulty nodes automatically on L4. By hand it weighs as much "
            "as terminating, so it needs a manager.",
        ),
        Action.EDIT_REVIEW: ActionPolicy(
            "write an incident's post-mortem review",
            _same_everywhere(Role.ONCALL),
            "The people who handled the incident write it up: on-call and above. Viewers read "
            "and export reviews (view).",
        ),
        Action.CREATE_JOB: ActionPolicy(
            "create a job and its agent token",
            _same_everywhere(Role.MANAGER),
            "A job's agent token lets a process stream metrics and receive commands in the "
            "team's name, so creating one is a manager's decision.",
        ),
        Action.MANAGE_SHIFTS: ActionPolicy(
            "manage the on-call shifts",
            _same_everywhere(Role.MANAGER),
            "Managers arrange who is on call: a shift decides who is paged, not who is "
            "authorised, so it grants nobody a role. Roles stay with admins (manage_members).",
        ),
        Action.MANAGE_SILENCES: ActionPolicy(
            "silence the team's pages (maintenance windows)",
            _same_everywhere(Role.MANAGER),
            "A silence (per team, job or rule, with an end and a reason) stops pages, never a "
            "brake: like a shift it decides who is woken, not what the breakers do, so it is "
            "the managers'. On-call asks a manager; the silenced alerts are still recorded, "
            "audited and shown as silenced.",
        ),
        Action.EDIT_RULES: ActionPolicy(
            "edit the team's rules",
            _same_everywhere(Role.ADMIN),
            "Rules decide when the breaker fires on its own, so they are the admins' "
            "(docs/design.md).",
        ),
        Action.RUN_DRILL: ActionPolicy(
            "run a drill",
            _same_everywhere(Role.ADMIN),
            "Drills inject faults and test the rules admins own, so they are the admins' too "
            '(docs/design.md, "Drills").',
        ),
        Action.MANAGE_MEMBERS: ActionPolicy(
            "manage the team's members and roles",
            _same_everywhere(Role.ADMIN),
            "Only admins grant roles, so nobody can raise their own authority.",
        ),
        Action.MANAGE_NOTIFICATIONS: ActionPolicy(
            "manage the notification channels",
            _same_everywhere(Role.ADMIN),
            "Channels decide whether L3/L4 reach a phone at all, so they are the admins' "
            "(docs/design.md).",
        ),
    }
)

_ROLE_NAME: Mapping[Role, str] = MappingProxyType(
    {Role.VIEWER: "viewer", Role.ONCALL: "on-call", Role.MANAGER: "manager", Role.ADMIN: "admin"}
)
_ROLE_WITH_ARTICLE: Mapping[Role, str] = MappingProxyType(
    {
        Role.VIEWER: "a viewer",
        Role.ONCALL: "an on-call engineer",
        Role.MANAGER: "a manager",
        Role.ADMIN: "an admin",
    }
)


def parse_role(role: str | None) -> Role | str | None:
    """Return the Role, ``SYSTEM`` or None; raise ValueError for anything else."""
    if role is None or role == SYSTEM:
        return role
    try:
        return Role(role)
    except ValueError:
        raise ValueError(
            f"unknown role {role!r}: expected one of {[r.value for r in Role]}, {SYSTEM!r} or None"
        ) from None


def parse_action(action: str) -> Action:
    """Return the Action; raise ValueError for an unknown one."""
    try:
        return Action(action)
    except ValueError:
        raise ValueError(
            f"unknown action {action!r}: expected one of {[a.value for a in Action]}"
        ) from None


def parse_level(level: str | None) -> Level | None:
    """Return the Level or None; raise ValueError for anything else."""
    if level is None:
        return None
    try:
        return Level(level)
    except ValueError:
        raise ValueError(
            f"unknown level {level!r}: expected one of {[v.value for v in Level]} or None"
        ) from None


def role_rank(role: str | None) -> int:
    """Where ``role`` stands in ``ROLE_ORDER`` (0 for a viewer); -1 for no role, ``SYSTEM`` or
    anything that is not a team role. What sorts people's roles, lowest first."""
    try:
        return _RANK[Role(role)] if role is not None else -1
    except ValueError:
        return -1


def role_at_least(role: str | None, minimum: str) -> bool:
    """True when ``role`` ranks at or above ``minimum`` in a team.

    None (no role in the team) and ``SYSTEM`` (no rank) are never at least anything.
    """
    actor = parse_role(role)
    floor = parse_role(minimum)
    if not isinstance(floor, Role):
        raise ValueError(f"minimum must be a team role, not {minimum!r}")
    if not isinstance(actor, Role):
        return False
    return _RANK[actor] >= _RANK[floor]


def decide(
    role: str | None,
    action: str,
    level: str | None = None,
    *,
    is_own_request: bool = False,
) -> Decision:
    """May ``role`` do ``action`` on an alert of ``level`` (None: no alert)?

    ``is_own_request`` matters only for approving or rejecting an escalation: True when the
    acting person made the request. Prefer ``decide_on_escalation``, which computes it.
    """
    actor = parse_role(role)
    act = parse_action(action)
    lvl = parse_level(level)
    policy = MATRIX[act]
    cell = policy.cells[lvl]
    minimum = cell.minimum_role.value if cell.minimum_role else None

    actor_name = actor.value if isinstance(actor, Role) else actor

    def answer(allowed: bool, reason: str) -> Decision:
        return Decision(allowed, reason, minimum, act.value, actor_name, lvl.value if lvl else None)

    if actor == SYSTEM:
        return answer(cell.system, _system_reason(policy, cell, lvl))
    if actor is None:
        return answer(False, f"You have no role in this team, so you may not {policy.phrase}.")
    assert isinstance(actor, Role)  # narrowed: SYSTEM and None are handled above
    clause = _level_clause(lvl) if policy.people_depend_on_level else ""
    if cell.minimum_role is None:
        return answer(False, f"Nobody may {policy.phrase}{clause}: {cell.why_nobody}.")
    if not role_at_least(actor, cell.minimum_role):
        return answer(False, _too_low_reason(policy, cell.minimum_role, actor, clause))
    if is_own_request and act in REQUEST_DECISIONS:
        return answer(
            False,
            f"Nobody may {policy.phrase} they made themselves; another manager or an admin "
            "must decide it.",
        )
    return answer(True, f"{_ROLE_WITH_ARTICLE[actor].capitalize()} may {policy.phrase}{clause}.")


def decide_on_escalation(
    role: str | None,
    action: str,
    *,
    requester_id: object,
    decider_id: object,
    level: str | None = None,
) -> Decision:
    """Approve or reject an escalation request, refusing the requester's own decision.

    Identities are compared as strings, so a user id given as ``5`` by one caller and ``"5"``
    by another still counts as the same person (a mismatch here would let a self-approval
    through). A missing requester (None) is nobody's own request.
    """
    act = parse_action(action)
    if act not in REQUEST_DECISIONS:
        raise ValueError(f"{action!r} is not a decision on a request")
    if decider_id is None:
        raise ValueError("decider_id is required: a decision is always made by someone")
    is_own = requester_id is not None and str(requester_id) == str(decider_id)
    return decide(role, act, level, is_own_request=is_own)


def allowed_actions(role: str | None, level: str | None = None) -> set[str]:
    """Every action ``role`` may do at ``level`` (escalation decisions on others' requests)."""
    return {action.value for action in Action if decide(role, action, level).allowed}


def action_for_command(kind: str) -> Action:
    """The action that authorises issuing a control-plane command of ``kind``."""
    try:
        return COMMAND_ACTIONS[kind]
    except KeyError:
        raise ValueError(
            f"unknown command kind {kind!r}: expected one of {sorted(COMMAND_ACTIONS)}"
        ) from None


def _level_clause(level: Level | None) -> str:
    return " without an alert" if level is None else f" on an {level.value} alert"


def _too_low_reason(policy: ActionPolicy, minimum: Role, actor: Role, clause: str) -> str:
    who = _ROLE_WITH_ARTICLE[minimum]
    if minimum is not Role.ADMIN:
        who += " or above"
    return f"Only {who} may {policy.phrase}{clause}; your role in this team is {_ROLE_NAME[actor]}."


def _system_reason(policy: ActionPolicy, cell: Cell, level: Level | None) -> str:
    clause = _level_clause(level)
    if cell.system:
        return f"The system may {policy.phrase}{clause} automatically, without waiting for anyone."
    return (
        f"The system may not {policy.phrase}{clause}: it acts on its own only for the automatic "
        "actions of the severity table (L2 soft mitigation, L3 checkpoint and pause, "
        "L4 terminate and isolate)."
    )


# ---------------------------------------------------------------------------------------------
# docs/authority-matrix.md is this function's output, byte for byte (a test checks it).

_DOC_HEADER = """\
# Authority matrix

Generated from `incidents.teams.authority.MATRIX` by `matrix_markdown()`: do not edit by hand.
Regenerate with `python -m incidents.teams.authority > docs/authority-matrix.md`; a test fails when
this file and the code differ.

- Roles are per team and ordered viewer < oncall < manager < admin: a higher role may do
  everything a lower one may. A person with no role in the job's team may do nothing, not
  even view.
- `system` is the automatic actor (the breakers). It is not a team role and may only do the
  automatic actions of the severity table, without waiting for anyone.
- "alert level" is the severity of the alert the action concerns; `none` means there is no
  alert (a person acting on their own initiative). `any` means the level does not matter.
- Nobody approves or rejects an escalation they requested themselves, whatever their role
  (`decide_on_escalation(role, action, requester_id=..., decider_id=...)`).
- An unknown role, action or level is a programming error (`ValueError`), never a silent deny.
"""


def matrix_markdown() -> str:
    """Render the role × action × level matrix and its rationale as Markdown."""
    columns = [role.value for role in ROLE_ORDER] + [SYSTEM]
    lines = [_DOC_HEADER, "| action | alert level | " + " | ".join(columns) + " |"]
    lines.append("|" + "---|" * (len(columns) + 2))
    for action, policy in MATRIX.items():
        lines += [_table_row(action, levels, cell) for levels, cell in _group_levels(policy)]
    lines += ["", "## Why", ""]
    for action, policy in MATRIX.items():
        lines.append(f"- `{action.value}` ({policy.phrase}): {policy.rationale}")
        lines += [
            f"  - Nobody{_level_clause(level)}: {cell.why_nobody}."
            for level, cell in policy.cells.items()
            if cell.minimum_role is None
        ]
    return "\n".join(lines) + "\n"


def _table_row(action: Action, levels: str, cell: Cell) -> str:
    people = [
        cell.minimum_role is not None and role_at_least(role, cell.minimum_role)
        for role in ROLE_ORDER
    ]
    marks = ["yes" if allowed else "no" for allowed in [*people, cell.system]]
    return f"| `{action.value}` | {levels} | " + " | ".join(marks) + " |"


def _group_levels(policy: ActionPolicy) -> list[tuple[str, Cell]]:
    """Levels with the same yes/no marks, as one row each, in level order.

    Cells differing only in ``why_nobody`` share a row: the reasons are listed under "Why".
    """
    groups: dict[tuple[Role | None, bool], tuple[list[str], Cell]] = {}
    for level, cell in policy.cells.items():
        names, _ = groups.setdefault((cell.minimum_role, cell.system), ([], cell))
        names.append(_level_name(level))
    if len(groups) == 1:
        return [("any", policy.cells[None])]
    return [(", ".join(names), cell) for names, cell in groups.values()]


def _level_name(level: Level | None) -> str:
    return "none" if level is None else level.value


if __name__ == "__main__":
    sys.stdout.write(matrix_markdown())
