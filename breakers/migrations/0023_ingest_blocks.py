# Ingest writes blocks (breakers.agent.store): one MetricBlock per rank and node of a batch,
# instead of one MetricPoint row per point, on PostgreSQL.

from django.db import migrations, models

# A block written by ingest takes its last_id from the raw points' id sequence (the column's
# default, evaluated per row by COPY): ids stay one commit-ordered series per job, raw rows of an
# upgraded console below every new block, so every "id > cursor" reader (evaluator, rollups,
# compaction, a chart's unmerged tail) walks raw rows and blocks as one sequence. A block folded
# by compaction keeps the greatest last_id of what it merged, at or below every cursor.
DEFAULT_SQL = """
DO $$ BEGIN
  EXECUTE 'ALTER TABLE breakers_metricblock ALTER COLUMN last_id SET DEFAULT nextval('
    || quote_literal(pg_get_serial_sequence('breakers_metricpoint', 'id')) || ')';
END $$;
"""

# The cursor walk over blocks, and the readers' sets of points by id.
INDEX_SQL = "CREATE INDEX metric_block_cursor ON breakers_metricblock (job_id, last_id)"

# Every point of a job with id in (p_after, p_high]: raw rows and the points of blocks, a block's
# all at once (its last_id). One SELECT: the planner inlines it into the caller's query.
POINTS_AFTER_FUNCTION = """
CREATE OR REPLACE FUNCTION brakeline_points_after(p_job bigint, p_after bigint, p_high bigint)
RETURNS TABLE (id bigint, name varchar, step bigint, "time" timestamptz, value float8,
               node varchar, rank int)
LANGUAGE sql STABLE PARALLEL SAFE AS $body$
  SELECT p.id, p.name, p.step, p.time, p.value, p.node, p.rank FROM breakers_metricpoint p
  WHERE p.job_id = p_job AND p.id > p_after AND p.id <= p_high
  UNION ALL
  SELECT b.last_id, b.names[m.k], u.step, u.at + coalesce(u.delta, 0) * interval '1 microsecond',
    u.value, b.node, b.rank
  FROM breakers_metricblock b
  CROSS JOIN LATERAL generate_subscripts(b.names, 1) AS m(k)
  CROSS JOIN LATERAL unnest(
      coalesce(b.steps, ARRAY(SELECT generate_series(b.first_step, b.last_step))),
      b.times, b.vals[m.k:m.k][:], b.tdelta[m.k:m.k][:])
    AS u(step, at, value, delta)
  WHERE b.job_id = p_job AND b.last_id > p_after AND b.last_id <= p_high
    AND u.value IS NOT NULL
$body$
"""

# The next chunk of a job's points above p_after: (the greatest id of it, its points, whether
# more follow), at most p_limit points unless one block alone holds more. A chunk ends on a
# block's edge: a cursor set to a block's last_id has read all of it.
PENDING_FUNCTION = """
CREATE OR REPLACE FUNCTION brakeline_pending(p_job bigint, p_after bigint, p_limit bigint)
RETURNS TABLE (high bigint, points bigint, more boolean)
LANGUAGE sql STABLE AS $body$
  SELECT max(id) FILTER (WHERE before < p_limit),
         coalesce(sum(n) FILTER (WHERE before < p_limit), 0)::bigint,
         coalesce(bool_or(before >= p_limit), false)
  FROM (
    SELECT id, n, sum(n) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) - n AS before FROM (
      (SELECT p.id, 1::bigint AS n FROM breakers_metricpoint p
       WHERE p.job_id = p_job AND p.id > p_after ORDER BY p.id LIMIT p_limit + 1)
      UNION ALL
      (SELECT b.last_id, (SELECT count(v) FROM unnest(b.vals) AS v)
       FROM breakers_metricblock b
       WHERE b.job_id = p_job AND b.last_id > p_after ORDER BY b.last_id LIMIT p_limit + 1)
    ) AS pending
  ) AS counted
$body$
"""

def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (DEFAULT_SQL, INDEX_SQL, POINTS_AFTER_FUNCTION, PENDING_FUNCTION):
            schema_editor.execute(sql)
    else:  # the embedded mode's plain table: the index only (ingest keeps rows there)
        schema_editor.execute(INDEX_SQL)


def backwards(apps, schema_editor):
    schema_editor.execute("DROP INDEX IF EXISTS metric_block_cursor")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE breakers_metricblock ALTER COLUMN last_id DROP DEFAULT")
        schema_editor.execute("DROP FUNCTION IF EXISTS brakeline_points_after(bigint, bigint, bigint)")
        schema_editor.execute("DROP FUNCTION IF EXISTS brakeline_pending(bigint, bigint, bigint)")


class Migration(migrations.Migration):

    dependencies = [
        ("breakers", "0022_metric_blocks"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="metricblock",
                    index=models.Index(fields=["job", "last_id"], name="metric_block_cursor"),
                ),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
