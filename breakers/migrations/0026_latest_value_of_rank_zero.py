# The job list's "latest loss" is rank 0's, as its sparkline is (breakers.metrics.recent_points):
# the newest blocks of every rank of a thousand-rank job all start at the same step, so the
# newest few blocks of the series span every rank's batch and the value read them all (190 ms a
# job page at 1,000 ranks × 200 steps, bench/ranks_console.py); rank 0's newest blocks hold
# a batch of one rank.

import importlib

from django.db import migrations

LATEST_OF_RANK_ZERO = """
CREATE OR REPLACE FUNCTION brakeline_latest_value(p_job bigint, p_name text)
RETURNS float8 LANGUAGE sql STABLE PARALLEL SAFE AS $body$
  SELECT value FROM (
    (SELECT p.step, p.time, p.value FROM breakers_metricpoint p
     WHERE p.job_id = p_job AND p.name = p_name AND p.rank = 0
     ORDER BY p.step DESC, p.time DESC LIMIT 1)
    UNION ALL
    (SELECT u.step, u.time, u.value
     FROM (SELECT min(first_step) AS low, max(last_step) AS high
           FROM (SELECT first_step, last_step FROM breakers_metricblock
                 WHERE job_id = p_job AND rank = 0 AND names @> ARRAY[p_name::varchar]
                 ORDER BY first_step DESC LIMIT 8) AS newest_blocks) AS b
     CROSS JOIN LATERAL brakeline_points(p_job, p_name, b.low, b.high) AS u
     WHERE u.rank = 0
     ORDER BY u.step DESC, u.time DESC LIMIT 1)
  ) AS newest ORDER BY step DESC, time DESC LIMIT 1
$body$
"""


def of_rank_zero(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(LATEST_OF_RANK_ZERO)


def of_any_rank(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        blocks = importlib.import_module("breakers.migrations.0022_metric_blocks")
        schema_editor.execute(blocks.LATEST_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("breakers", "0025_console_hearing")]

    operations = [migrations.RunPython(of_rank_zero, of_any_rank)]
