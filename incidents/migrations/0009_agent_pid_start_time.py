from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("incidents", "0008_notifications")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="agent_pid_start_time",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
