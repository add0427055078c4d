"""Rule set versions (issue 19, part 4), append-only: the model and its queryset refuse updates
and deletes, and on PostgreSQL a trigger refuses them for everyone (as incidents 0003 and 0006
do for the timeline and the audit trail). TRUNCATE is not covered: wiping a database is not an
edit of the record."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Separate statements, and no "%" in them: the schema editor passes parameters to execute().
CREATE = [
    """
    CREATE OR REPLACE FUNCTION breakers_rulesetversion_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION USING
            MESSAGE = 'breakers_rulesetversion is append-only: ' || TG_OP || ' refused',
            ERRCODE = 'restrict_violation';
    END;
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER breakers_rulesetversion_append_only
        BEFORE UPDATE OR DELETE ON breakers_rulesetversion
        FOR EACH ROW EXECUTE FUNCTION breakers_rulesetversion_append_only()
    """,
]
DROP = [
    "DROP TRIGGER IF EXISTS breakers_rulesetversion_append_only ON breakers_rulesetversion",
    "DROP FUNCTION IF EXISTS breakers_rulesetversion_append_only()",
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
        ("breakers", "0014_metric_batch_ids"),
        ("incidents", "0013_job_ranks_world_size"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RuleSetVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField()),
                ("why", models.TextField()),
                ("summary", models.CharField(max_length=300)),
                ("diff", models.JSONField(default=list)),
                ("snapshot", models.JSONField()),
                ("fingerprint", models.CharField(max_length=64)),
                (
                    "actor",
                    models.ForeignKey(
                        blank=True,
                        help_text="Empty: the system (a change made outside the console, found and recorded).",
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="ruleset_versions",
                        to="incidents.team",
                    ),
                ),
            ],
            options={"ordering": ["team", "-number"]},
        ),
        migrations.AddConstraint(
            model_name="rulesetversion",
            constraint=models.UniqueConstraint(
                fields=("team", "number"), name="ruleset_version_once"
            ),
        ),
        migrations.RunPython(create_trigger, drop_trigger),
    ]
