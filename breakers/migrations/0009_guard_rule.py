"""The default pack's new rule: an update the SDK's step guard refused brakes (L3).

Create-only, like 0004: the missing default rules are added, edited ones are left alone.
"""

from django.db import migrations


def install_default_pack(apps, schema_editor):
    from breakers.detection.rules import install_default_pack

    install_default_pack(apps.get_model("breakers", "Rule"))


class Migration(migrations.Migration):
    dependencies = [
        ("breakers", "0008_checkpoint_catalogue"),
    ]

    operations = [
        migrations.RunPython(install_default_pack, migrations.RunPython.noop),
    ]
