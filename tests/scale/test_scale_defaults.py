"""The defaults are right for one job of 10,000 ranks: its requests at the SDK's defaults stay
well under its agent rate limit, rank by rank and node by node, and the shipped balancer has
room for its connections and never cuts an idle agent websocket."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from brakeline._forwarder import URGENT_WAIT
from brakeline._settings import Settings
from breakers.agent.bundle import MAX_BUNDLE_PARTS
from console.ratelimit import agent_rate

ROOT = Path(__file__).resolve().parents[2]
RANKS, PER_NODE = 10_000, 8
# What Daphne is started with in docker-compose.yml and the Dockerfile: its default.
DAPHNE_PING_SECONDS = 20


def _per_minute(count: int, period: int) -> float:
    return count * 60 / period


def _sdk_requests_per_rank_minute() -> float:
    """At the SDK's defaults, with heartbeats apart from batches (an SDK before protocol 3,
    the most requests a rank sends): a batch every flush interval and a heartbeat every
    heartbeat interval."""
    defaults = Settings()
    return 60 / defaults.flush_interval + 60 / defaults.heartbeat_interval


@pytest.mark.django_db
def test_a_10000_rank_job_rank_by_rank_has_twice_its_requests_in_its_rate_limit():
    limit = _per_minute(*agent_rate(RANKS))
    sent = RANKS * _sdk_requests_per_rank_minute()
    # Twice: room for acks, retries after an outage and the first heartbeats' burst.
    assert limit >= 2 * sent, (limit, sent)


@pytest.mark.django_db
def test_a_10000_rank_job_of_nodes_sends_far_fewer_bundles_than_its_limit():
    """A node's forwarder sends a bundle per flush interval, and an urgent one (an ack, a
    hold) at most every URGENT_WAIT: even a node that did both all the time is under."""
    limit = _per_minute(*agent_rate(RANKS))
    nodes = RANKS // PER_NODE
    steady = nodes * 60 / Settings().flush_interval
    assert limit >= 10 * steady, (limit, steady)
    # Even every node sending urgent bundles back to back, all minute long, is not refused.
    assert limit / 60 >= nodes / URGENT_WAIT, (limit, nodes)
    assert PER_NODE * 3 <= MAX_BUNDLE_PARTS  # a batch, a heartbeat and an ack per rank


def _section(name: str) -> str:
    """The lines of one section of the shipped deploy/haproxy.cfg, up to its blank line."""
    text = (ROOT / "deploy" / "haproxy.cfg").read_text()
    return text.split(f"\n{name}\n", 1)[1].split("\n\n", 1)[0]


def _haproxy_setting(section: str, name: str) -> str:
    body = _section(section)
    match = re.search(rf"^\s+{re.escape(name)}\s+(\S+)", body, re.MULTILINE)
    assert match, f"{name} is not set in {section}"
    return match.group(1)


def test_the_balancer_holds_a_websocket_and_a_request_for_each_of_10000_ranks():
    """HAProxy's connection limit is half its file limit unless the config fixes one (a
    client's and a replica's side per connection)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    files = compose["services"]["balancer"]["ulimits"]["nofile"]
    fixed = re.search(r"^\s+maxconn\s+(\d+)", _section("global"), re.MULTILINE)
    connections = int(fixed.group(1)) if fixed else files // 2
    assert connections >= 2 * RANKS and files >= 2 * connections, (connections, files)
    assert compose["services"]["web"]["ulimits"]["nofile"] >= RANKS  # a websocket each


def _seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()
    return int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 0.001}[unit]


def test_an_idle_agent_websocket_is_never_cut_by_the_balancer():
    """Daphne pings every socket; the tunnel timeout must outlast several pings."""
    assert _seconds(_haproxy_setting("defaults", "timeout tunnel")) >= 3 * DAPHNE_PING_SECONDS
