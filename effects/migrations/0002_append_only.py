from django.db import migrations

from decisionflow.append_only import append_only_triggers


class Migration(migrations.Migration):
    dependencies = [("effects", "0001_initial")]

    operations = [append_only_triggers(["effects_effectrecord", "effects_commitattempt"])]
