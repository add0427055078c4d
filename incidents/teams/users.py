"""The users the services take, as types: who acts, and who only asks to see.

``AUTH_USER_MODEL`` is Django's own ``auth.User``. Whoever *acts* (acknowledges, decides,
writes a review, owns a token) is one, signed in: those services take a ``User``, and a person
acting where the system may act instead is a ``User | None``. Whoever only asks to *see* may be
anybody: ``request.user``, a websocket's ``scope["user"]``, or no one at all. That is a
``Visitor``, answered as a stranger (nothing visible, no role) unless signed in.
"""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser, User

Visitor: TypeAlias = User | AnonymousUser | None

__all__ = ["User", "Visitor"]
