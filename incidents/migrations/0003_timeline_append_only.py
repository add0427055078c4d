"""On PostgreSQL, a trigger makes the incident timeline append-only for everyone.

The model and its queryset refuse updates and deletes already; the trigger also stops raw SQL,
a shell, another service with database access. TRUNCATE (an operator wiping the database, the
test suite's flush) is deliberately not covered: it is not an edit of the record.
"""

from django.db import migrations

# Separate statements, and no "%" in them: the schema editor passes parameters to execute().
CREATE = [
    """
    CREATE OR REPLACE FUNCTION incidents_timeline_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION USING
            MESSAGE = 'incidents_timelineentry is append-only: ' || TG_OP || ' refused',
            ERRCODE = 'restrict_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER incidents_timeline_append_only
        BEFORE UPDATE OR DELETE ON incidents_timelineentry
        FOR EACH ROW EXECUTE FUNCTION incidents_timeline_append_only()
    """,
]
DROP = [
    "DROP TRIGGER IF EXISTS incidents_timeline_append_only ON incidents_timelineentry",
    "DROP FUNCTION IF EXISTS incidents_timeline_append_only()",
]


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in CREATE:
            schema_editor.execute(statement)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ("incidents", "0002_alerts_incidents_timeline"),
    ]

    operations = [
        migrations.RunPython(create_trigger, drop_trigger),
    ]
