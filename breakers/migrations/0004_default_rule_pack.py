"""Install the default rule pack (breakers.detection.rulepack) as rows with team = NULL.

Create-only (``breakers.detection.rules.install_default_pack``): a default rule an admin has edited is
left as it is; a later migration calling it again only adds the keys that are missing.
"""

from django.db import migrations


def install_default_pack(apps, schema_editor):
    from breakers.detection.rules import install_default_pack

    install_default_pack(apps.get_model("breakers", "Rule"))


def remove_default_pack(apps, schema_editor):
    apps.get_model("breakers", "Rule").objects.filter(team=None).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("breakers", "0003_rules_evaluation_state"),
    ]

    operations = [
        migrations.RunPython(install_default_pack, remove_default_pack),
    ]
