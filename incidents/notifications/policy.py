"""What people do to notifications: set the team's policy, their contact, send a test; and the
pages that are no alert's (escalation requests waiting for a manager, a failed Slurm call).

Policy changes belong to admins (``Action.MANAGE_NOTIFICATIONS``): the channels decide whether
an L3 reaches a phone at all.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput
from core.text import fit
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    Alert,
    ChatFormat,
    Contact,
    Delivery,
    DrillDelivery,
    EscalationRequest,
    Incident,
    Job,
    JobStatus,
    Membership,
    NotificationPolicy,
    Role,
    Team,
    TimelineKind,
)
from incidents.notifications.messages import job_link
from incidents.notifications.outbound import RefusedURL, check_url
from incidents.notifications.recipients import managers_of, notifications_configured
from incidents.notifications.rounds import queue_message
from incidents.notifications.routing import (
    CHANNELS,
    LEVELS,
    Message,
    PolicyError,
    number,
    validate_rules,
)
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.oncall import who_is_on_call
from incidents.teams.users import User

POLICY_FIELDS = (
    "rules",
    "chat_webhook_url",
    "chat_format",
    "ack_timeout_seconds",
    "drill_delivery",
)
MAX_DRILL_RECEIVERS = 50


def _admin_team(user: User, team_id: int, attempt: Attempt) -> Team:
    team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
    attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_NOTIFICATIONS))
    return team


def clean_policy(data: dict[str, Any]) -> dict[str, Any]:
    """The policy fields given, checked; InvalidInput carries the paging rules' reason (400)."""
    clean: dict[str, Any] = {}
    if "rules" in data:
        try:
            clean["rules"] = validate_rules(data["rules"])
        except PolicyError as error:
            raise InvalidInput(str(error), fields={"rules": str(error)}) from None
    if "chat_webhook_url" in data:
        _check_chat_webhook_url(data["chat_webhook_url"])
    if "chat_format" in data and data["chat_format"] not in ChatFormat.values:
        raise InvalidInput("Unknown chat format.", fields={"chat_format": "generic or slack"})
    timeout = data.get("ack_timeout_seconds", 300)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 30 <= timeout <= 86400:
        raise InvalidInput(
            "ack_timeout_seconds must be a whole number of seconds from 30 to 86400.",
            fields={"ack_timeout_seconds": "30 ≤ seconds ≤ 86400"},
        )
    if data.get("escalate_min_level", "L2") not in LEVELS:
        raise InvalidInput("Unknown level.", fields={"escalate_min_level": "L1 … L4"})
    if "drill_delivery" in data and data["drill_delivery"] not in DrillDelivery.values:
        raise InvalidInput(
            "Unknown drill delivery.", fields={"drill_delivery": "on_call or receivers"}
        )
    for name in (*POLICY_FIELDS, "escalate_min_level"):
        if name in data and name not in clean:
            clean[name] = data[name]
    return clean


def _check_chat_webhook_url(url: Any) -> None:
    """A chat webhook is a URL of at most 500 characters the server may post to ("" for none)."""
    if not isinstance(url, str) or len(url) > 500:
        raise InvalidInput(
            "chat_webhook_url must be a URL of at most 500 characters.",
            fields={"chat_webhook_url": "an http:// or https:// URL"},
        )
    if url:
        try:
            check_url(url)
        except RefusedURL as refused:
            raise InvalidInput(
                f"chat_webhook_url is refused: {refused}.",
                fields={"chat_webhook_url": str(refused)},
            ) from None


def save_policy(
    user: User, team_id: int, data: dict[str, Any], *, context: AuditContext | None = None
) -> NotificationPolicy:
    """Create or change the team's notification policy (admins)."""
    with audited(user, Action.MANAGE_NOTIFICATIONS, "team", team_id, context) as attempt:
        team = _admin_team(user, team_id, attempt)
        fields = clean_policy(data)
        receivers = None
        if "drill_receivers" in data:
            receivers = _drill_receivers(team, data["drill_receivers"])
        with transaction.atomic():
            policy, _ = NotificationPolicy.objects.select_for_update().get_or_create(team=team)
            for name, value in fields.items():
                setattr(policy, name, value)
            _check_drills_page_somebody(policy, receivers)
            policy.save()
            if receivers is not None:
                policy.drill_receivers.set(receivers)
                fields["drill_receivers"] = [p.pk for p in receivers]
            attempt.succeeded(f"notification policy of {team.name}: {sorted(fields)}")
    return policy


def _drill_receivers(team: Team, value: Any) -> list[User]:
    """The members a drill pages: a list of user ids, each a member of the team."""
    if not isinstance(value, list) or len(value) > MAX_DRILL_RECEIVERS:
        raise InvalidInput(
            f"drill_receivers must be a list of at most {MAX_DRILL_RECEIVERS} user ids.",
            fields={"drill_receivers": "a list of the team's members' user ids"},
        )
    for person_id in value:
        if isinstance(person_id, bool) or not isinstance(person_id, int) or person_id < 1:
            raise InvalidInput(
                f"drill_receivers holds {fit(repr(person_id), 40)}, which is no user id.",
                fields={"drill_receivers": "a list of the team's members' user ids"},
            )
    people = []
    for person_id in dict.fromkeys(value):  # a repeated id is one receiver
        try:
            people.append(_member(team, person_id))
        except InvalidInput as error:
            raise InvalidInput(
                error.detail, fields={"drill_receivers": "must be members of the team"}
            ) from None
    return people


def _check_drills_page_somebody(policy: NotificationPolicy, receivers: list[User] | None) -> None:
    """Drills sent to the receivers need one at least: a drill must page somebody."""
    if policy.drill_delivery != DrillDelivery.RECEIVERS:
        return
    if receivers is None:
        # Receivers who have left the team are no longer paged (recipients.people_to_page).
        exists = (
            policy.pk is not None
            and policy.drill_receivers.filter(memberships__team_id=policy.team_id).exists()
        )
    else:
        exists = bool(receivers)
    if not exists:
        raise InvalidInput(
            "Drills go to the drill receivers, but none is named: a drill must page somebody.",
            fields={"drill_receivers": "at least one member when drill_delivery is receivers"},
        )


def set_contact(
    user: User, team_id: int, person_id: int, phone: str, *, context: AuditContext | None = None
) -> Contact:
    """Set a member's phone number (admins)."""
    with audited(user, Action.MANAGE_NOTIFICATIONS, "user", person_id, context) as attempt:
        team = _admin_team(user, team_id, attempt)
        person = _member(team, person_id)
        phone = phone.strip()
        if phone and not (phone.startswith("+") and phone[1:].isdigit() and len(phone) <= 16):
            raise InvalidInput(
                "A phone number in E.164 form (+15551234567).", fields={"phone": phone}
            )
        contact, _ = Contact.objects.update_or_create(user=person, defaults={"phone": phone})
        attempt.succeeded(f"contact of {person}: {phone or 'none'}")
    return contact


def _member(team: Team, person_id: int) -> User:
    person = get_user_model().objects.filter(pk=person_id).first()
    if person is None or role_in_team(person, team.pk) is None:
        raise InvalidInput(
            f"User {person_id} is not a member of team {team.name!r}.",
            fields={"user_id": "must be a member of the team"},
        )
    return person


def send_test_notification(
    user: User, team_id: int, person_id: int, channel: str, *, context: AuditContext | None = None
) -> Delivery:
    """A test message to one person on one channel (admins); the delivery says how it went."""
    with audited(user, Action.MANAGE_NOTIFICATIONS, "team", team_id, context) as attempt:
        team = _admin_team(user, team_id, attempt)
        if channel not in CHANNELS:
            raise InvalidInput("Unknown channel.", fields={"channel": ", ".join(CHANNELS)})
        person = _member(team, person_id)
        message = Message(
            f"TEST {team.name}: a test notification to {person} by {channel}",
            f"Sent by {user} from the Brakeline console. Nothing is wrong.",
        )
        delivery = queue_message(team.pk, person, channel, message, purpose="test")
        attempt.succeeded(f"test {channel} to {person}: delivery #{delivery.pk}")
    return delivery


def queue_to(
    team_id: int,
    people: list[User],
    channels: tuple[str, ...],
    message: Message,
    *,
    purpose: str,
    incident_id: int | None = None,
) -> list[int]:
    """One queued delivery per person and channel (person by person), for a page that is no
    alert's; their ids."""
    return [
        queue_message(
            team_id, person, channel, message, purpose=purpose, incident_id=incident_id
        ).pk
        for person in people
        for channel in channels
    ]


ASK_CONFIRMATION = "ask_confirmation"  # audit action; allowed to whoever may pause the job


def ask_for_confirmation(
    user: User, job_id: int, note: str = "", *, context: AuditContext | None = None
) -> list[int]:
    """A paused job waits for a manager's confirmation (keep, resume, roll back): page the
    managers by chat and e-mail that someone asks for it, and note it on the timeline."""
    with audited(user, ASK_CONFIRMATION, "job", job_id, context) as attempt:
        job = _paused_job(user, job_id, attempt)
        managers = managers_of(job.team_id)
        incident = Incident.objects.filter(job=job).order_by("-opened_at", "-id").first()
        message = _confirmation_message(job, user, note)
        with transaction.atomic():
            ids = queue_to(
                job.team_id,
                managers,
                ("chat", "email"),
                message,
                purpose="confirmation",
                incident_id=incident.pk if incident else None,
            )
            names = ", ".join(p.get_username() for p in managers) or "nobody (no manager)"
            if incident is not None:
                append_timeline(
                    incident.pk,
                    TimelineKind.NOTE,
                    f"{user} asked a manager to confirm the pause; paged {names}",
                    actor_kind="person",
                    actor=user,
                )
            attempt.succeeded(f"asked {names} to confirm the pause of {job.name}")
    return ids


def _paused_job(user: User, job_id: int, attempt: Attempt) -> Job:
    """The job (within the user's teams, who must be allowed to pause it), paused."""
    job = scoped_get(
        Job.objects.select_related("team"),
        user,
        job_id,
        team_path="team_id",
        noun="job",
        attempt=attempt,
    )
    attempt.check(decide(role_in_team(user, job.team_id), Action.PAUSE_JOB))
    if job.status != JobStatus.PAUSED:
        raise Conflict(f"Job {job.name!r} is {job.status}, not paused: nothing to confirm.")
    return job


def _confirmation_message(job: Job, user: User, note: str) -> Message:
    """The page asking a manager to confirm the pause, with the asker's note and a link."""
    return Message(
        f"{job.team.name}/{job.name} is paused: {user} asks a manager to confirm it "
        "(keep paused, resume or roll back)",
        (f"Note: {note.strip()}\n" if note.strip() else "") + f"Open: {job_link(job.pk)}",
    )


def notify_escalation_request(request_id: int, *, expired: bool) -> list[int]:
    """Chat and e-mail the team's managers: a request waits for a decision (or expired)."""
    request = EscalationRequest.objects.select_related("job__team").get(pk=request_id)
    job = request.job
    if not notifications_configured(job.team_id):
        return []
    what = "expired undecided" if expired else "awaits a manager's decision"
    message = Message(
        f"{request.level or 'L?'} {job.team.name}/{job.name}: escalation #{request.pk} "
        f"({request.command_kind}) {what}",
        f"Reason: {request.reason}\nOpen: {job_link(job.pk)}",
    )
    return queue_to(
        job.team_id,
        managers_of(job.team_id),
        ("chat", "email"),
        message,
        purpose="escalation",
        incident_id=request.incident_id,
    )


def notify_incident_people(incident_id: int, first_line: str, body: str) -> list[int]:
    """Page the on-call person and the managers by phone and chat (a brake that failed)."""
    incident = Incident.objects.select_related("job__team").get(pk=incident_id)
    team_id = incident.job.team_id
    if not notifications_configured(team_id):
        return []
    people = list(dict.fromkeys([*who_is_on_call(team_id)[:1], *managers_of(team_id)]))
    message = Message(first_line, body + f"\nOpen: {job_link(incident.job_id)}")
    return queue_to(
        team_id, people, ("phone", "chat"), message, purpose="scheduler", incident_id=incident_id
    )


def notify_team_admins(team_id: int, first_line: str, body: str, *, purpose: str) -> list[int]:
    """Chat and e-mail the person on call and the team's admins (who own its rules and run its
    drills): something about the braking set-up itself needs a person, and it is no alert's
    (a scheduled drill that failed). No phone: nothing is braking now."""
    if not notifications_configured(team_id):
        return []
    admins = Membership.objects.filter(team_id=team_id, role=Role.ADMIN).select_related("user")
    people = list(
        dict.fromkeys([*who_is_on_call(team_id)[:1], *(m.user for m in admins.order_by("id"))])
    )
    with transaction.atomic():
        return queue_to(
            team_id, people, ("chat", "email"), Message(first_line, body), purpose=purpose
        )


def send_daily_digest(team_id: int, *, now: datetime | None = None) -> list[int]:
    """E-mail the team's performance findings of the last 24 h to its members (docs/design.md:
    a daily digest, never a phone). Once per team and day: the day is in the first line, and the
    policy row's lock serialises two beats asking at once."""
    now = now or timezone.now()
    with transaction.atomic():
        policy = NotificationPolicy.objects.select_for_update().filter(team_id=team_id).first()
        if policy is None:
            return []
        team = policy.team
        findings = list(
            Alert.objects.filter(
                job__team_id=team_id,
                layer="performance",
                raised_at__gte=now - timedelta(days=1),
                raised_at__lt=now,
            )
            .select_related("job")
            .order_by("raised_at")
        )
        day = f"Daily digest {team.name} {now:%Y-%m-%d}:"
        sent = Delivery.objects.filter(
            team_id=team_id, purpose="digest", first_line__startswith=day
        )
        if not findings or sent.exists():
            return []
        first_line = f"{day} {len(findings)} performance finding(s)"
        lines = [
            f"{a.raised_at:%H:%M} {a.job.name}: {a.metric} = {number(a.value)} (threshold "
            f"{number(a.threshold)}) — {a.runbook_suggestion} {job_link(a.job_id)}"
            for a in findings
        ]
        message = Message(first_line, "\n".join(lines))
        members = Membership.objects.filter(team_id=team_id).select_related("user").order_by("id")
        return [
            queue_message(team_id, m.user, "email", message, purpose="digest").pk
            for m in members
            if m.user.email
        ]
