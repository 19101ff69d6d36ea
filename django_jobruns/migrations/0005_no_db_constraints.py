
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobruns', '0004_operator_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='jobrun',
            name='restarted_from',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='restarts', to='django_jobruns.jobrun'),
        ),
        migrations.AlterField(
            model_name='jobstep',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='django_jobruns.jobrun'),
        ),
    ]
