"""On PostgreSQL, a trigger makes the audit trail append-only for everyone (as 0003 does for
the incident timeline): the model and its queryset refuse already, the trigger also stops raw
SQL, a shell or another service with database access. TRUNCATE is deliberately not covered:
wiping a database is not an edit of the record.
"""

from django.db import migrations

# Separate statements, and no "%" in them: the schema editor passes parameters to execute().
CREATE = [
    """
    CREATE OR REPLACE FUNCTION incidents_audit_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION USING
            MESSAGE = 'incidents_auditentry is append-only: ' || TG_OP || ' refused',
            ERRCODE = 'restrict_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER incidents_audit_append_only
        BEFORE UPDATE OR DELETE ON incidents_auditentry
        FOR EACH ROW EXECUTE FUNCTION incidents_audit_append_only()
    """,
]
DROP = [
    "DROP TRIGGER IF EXISTS incidents_audit_append_only ON incidents_auditentry",
    "DROP FUNCTION IF EXISTS incidents_audit_append_only()",
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
        ("incidents", "0005_authorisation_chain"),
    ]

    operations = [
        migrations.RunPython(create_trigger, drop_trigger),
    ]
