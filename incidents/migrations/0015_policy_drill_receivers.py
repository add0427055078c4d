# Issue 19: whom a fire drill's page reaches (the real people, or the team's drill receivers).

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('incidents', '0014_job_drill_sandbox'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='notificationpolicy',
            name='drill_delivery',
            field=models.CharField(choices=[('on_call', 'The real people (on call)'), ('receivers', 'The drill receivers')], default='on_call', max_length=10),
        ),
        migrations.AddField(
            model_name='notificationpolicy',
            name='drill_receivers',
            field=models.ManyToManyField(blank=True, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
    ]
