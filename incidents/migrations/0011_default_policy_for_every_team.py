"""Teams created before the default policy existed page nobody: give each the default one
(new teams get it when they are created, incidents.teams.defaults)."""

from django.db import migrations


def give_defaults(apps, schema_editor):
    team_model = apps.get_model("incidents", "Team")
    policy_model = apps.get_model("incidents", "NotificationPolicy")
    from incidents.models.notifications import default_rules

    for team in team_model.objects.filter(notification_policy__isnull=True):
        policy_model.objects.create(team=team, rules=default_rules())


class Migration(migrations.Migration):
    dependencies = [("incidents", "0010_silences")]

    operations = [migrations.RunPython(give_defaults, migrations.RunPython.noop)]
