"""Chat: a webhook a team admin chose, generic JSON or a Slack-compatible payload. The URL is
checked again at send time (DNS may have changed since it was saved) and redirects are never
followed (incidents.notifications.outbound)."""

from __future__ import annotations

import json
from typing import Any

from incidents.notifications import outbound
from incidents.notifications.senders.base import DeliveryResult, Outgoing, http_post, http_result


def chat_payload(outgoing: Outgoing) -> dict[str, Any]:
    message = outgoing.message
    if outgoing.chat_format == "slack":
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": message.first_line}},
            {"type": "section", "text": {"type": "mrkdwn", "text": message.body}},
        ]
        if outgoing.ack_link:
            button = {"type": "plain_text", "text": "Acknowledge"}
            element = {"type": "button", "text": button, "url": outgoing.ack_link}
            blocks.append({"type": "actions", "elements": [element]})
        return {"text": message.first_line, "blocks": blocks}
    generic = {"title": message.first_line, "text": message.body}
    return {**generic, "acknowledge_url": outgoing.ack_link} if outgoing.ack_link else generic


def send_chat(outgoing: Outgoing) -> DeliveryResult:
    data = json.dumps(chat_payload(outgoing)).encode()
    try:
        outbound.check_url(outgoing.address)  # again: DNS may have changed since it was saved
        status, body, latency = http_post(
            outgoing.address, data, "application/json", outgoing.key_header(), guarded=True
        )
    except outbound.RefusedURL as refused:
        return DeliveryResult("failed", f"webhook URL refused: {refused}", 0.0)
    # A webhook that answers 2xx has posted the message: that is delivery for a chat.
    return http_result(status, body, latency, "delivered")
