"""The suite's password hasher: Django's PBKDF2-SHA256 at a thousand iterations.

Django's default (a million iterations) costs about a second of CPU on a loaded CI core, paid
for every user a test creates with a password. The hashes stay standard
``pbkdf2_sha256$<iterations>$...`` strings: the consoles the tests start as subprocesses, on the
production hasher, verify them by the count written in them (and re-hash them at their own
count on the first log-in, as after any upgrade of Django's default).
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
