"""The default guard rule alerts once per job: ``update-refused-by-guard`` pools its nodes.

In data-parallel training every rank refuses the same poisoned update, so one alert per node
said nothing more than one per job and cost an alert (and a page) per node. Only the stored
default row that still has the shipped value (per node) changes: a row an admin has edited
is left as it is, as 0004 and 0009 leave edited rules alone.
"""

from django.db import migrations

GUARD_RULE = "update-refused-by-guard"


def pool_nodes(apps, schema_editor):
    rule = apps.get_model("breakers", "Rule")
    rule.objects.filter(team=None, key=GUARD_RULE, per_node=True).update(per_node=False)


def per_node_again(apps, schema_editor):
    rule = apps.get_model("breakers", "Rule")
    rule.objects.filter(team=None, key=GUARD_RULE, per_node=False).update(per_node=True)


class Migration(migrations.Migration):
    dependencies = [
        ("breakers", "0031_evaluation_holds_awaited"),
    ]

    operations = [
        migrations.RunPython(pool_nodes, per_node_again),
    ]
