"""The notification settings (part of ``config.settings``, which imports every name here):
where pages go and how they are sent, answered and retried. Read from the environment like
the rest (README "Configuration")."""

import os

from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int, env_seconds, env_url

# Notifications: the job links in messages, the SMS/phone provider (a Twilio-style form POST),
# e-mail. Nothing is required: without a provider, SMS and phone deliveries fail visibly.
BRAKELINE_PUBLIC_URL = env_url("BRAKELINE_PUBLIC_URL", "http://127.0.0.1:8000")
NOTIFY_PROVIDER_BASE_URL = env_url("BRAKELINE_NOTIFY_PROVIDER_URL", "")
NOTIFY_PROVIDER_ACCOUNT_SID = os.environ.get("BRAKELINE_NOTIFY_PROVIDER_SID", "")
NOTIFY_PROVIDER_AUTH_TOKEN = os.environ.get("BRAKELINE_NOTIFY_PROVIDER_TOKEN", "")
NOTIFY_PROVIDER_FROM_NUMBER = os.environ.get("BRAKELINE_NOTIFY_FROM_NUMBER", "")
# Answers to a page (docs/security.md; no secret: replies refused) and the demo's Outbox.
NOTIFY_REPLY_SECRET = os.environ.get("BRAKELINE_NOTIFY_REPLY_SECRET", "")
NOTIFY_REPLY_MAX_AGE_SECONDS = env_seconds("BRAKELINE_NOTIFY_REPLY_MAX_AGE_SECONDS", 300.0)
NOTIFY_ACK_LINK_MAX_AGE_SECONDS = env_seconds("BRAKELINE_NOTIFY_ACK_LINK_MAX_AGE_SECONDS", 86400.0)
NOTIFY_OUTBOX = env_bool("BRAKELINE_NOTIFY_OUTBOX", False)
NOTIFY_EMAIL_FROM = os.environ.get("BRAKELINE_NOTIFY_EMAIL_FROM", "brakeline@localhost")
# Named explicitly, so a test runner's locmem EMAIL_BACKEND never swallows a page.
NOTIFY_EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = os.environ.get("BRAKELINE_SMTP_HOST", "localhost")
EMAIL_PORT = env_int("BRAKELINE_SMTP_PORT", 25)
EMAIL_HOST_USER = os.environ.get("BRAKELINE_SMTP_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("BRAKELINE_SMTP_PASSWORD", "")
EMAIL_USE_TLS = env_bool("BRAKELINE_SMTP_STARTTLS", False)
NOTIFY_MAX_ATTEMPTS = env_int("BRAKELINE_NOTIFY_MAX_ATTEMPTS", 5)
if NOTIFY_MAX_ATTEMPTS < 1:
    raise ImproperlyConfigured(f"BRAKELINE_NOTIFY_MAX_ATTEMPTS={NOTIFY_MAX_ATTEMPTS} is below 1.")
NOTIFY_RETRY_BASE_SECONDS = env_seconds("BRAKELINE_NOTIFY_RETRY_BASE_SECONDS", 2.0)
NOTIFY_HTTP_TIMEOUT_SECONDS = env_seconds("BRAKELINE_NOTIFY_HTTP_TIMEOUT_SECONDS", 10.0)
# A queued delivery not finished by its lease (claimed by a worker that died mid-send, or whose
# task message was lost with Redis) is re-queued by the sweeper. Far above the HTTP timeout: a
# live worker's send must end long before its lease does, or it could be sent twice.
NOTIFY_DELIVERY_LEASE_SECONDS = env_seconds("BRAKELINE_NOTIFY_LEASE_SECONDS", 120.0)
if NOTIFY_DELIVERY_LEASE_SECONDS < 3 * NOTIFY_HTTP_TIMEOUT_SECONDS:
    raise ImproperlyConfigured(
        f"BRAKELINE_NOTIFY_LEASE_SECONDS={NOTIFY_DELIVERY_LEASE_SECONDS:g} must be at least "
        "3 times BRAKELINE_NOTIFY_HTTP_TIMEOUT_SECONDS: a live send must end within its lease."
    )
# A team's chat webhook may point at loopback, link-local and private addresses only when the
# operator says so (a chat server on the private network; the test suite's own receivers).
NOTIFY_ALLOW_PRIVATE_URLS = env_bool("BRAKELINE_NOTIFY_ALLOW_PRIVATE_URLS", False)
