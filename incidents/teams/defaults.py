"""What a new team starts with: the default notification policy (docs/design.md
"Notifications and paging"), so that its first L3 pages its on-call by chat and phone as soon
as a webhook and phone numbers exist, instead of paging nobody without a word.

Connected to ``post_save`` of ``Team`` (``incidents.apps``): every way a team comes to exist
(``add_member``, ``create_job``, the admin, the demo) gets it.
"""

from __future__ import annotations

from typing import Any

from incidents.models import NotificationPolicy, Team


def give_default_policy(sender: type, instance: Team, created: bool, **kwargs: Any) -> None:
    if created and not kwargs.get("raw", False):  # raw: loading a fixture, rows come as saved
        NotificationPolicy.objects.get_or_create(team=instance)
