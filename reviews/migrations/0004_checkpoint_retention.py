from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def backfill_checkpoint_at(apps, schema_editor):
    """Copy each pause checkpoint's time onto its pending review, before any row is pruned."""
    PendingReview = apps.get_model("reviews", "PendingReview")
    WorkflowCheckpoint = apps.get_model("reviews", "WorkflowCheckpoint")
    taken = WorkflowCheckpoint.objects.filter(checkpoint_id=OuterRef("checkpoint_id")).values("created_at")[:1]
    PendingReview.objects.filter(checkpoint_at__isnull=True).update(checkpoint_at=Subquery(taken))


class Migration(migrations.Migration):
    dependencies = [
        ("cases", "0002_initial"),
        ("reviews", "0003_attribution"),
    ]

    operations = [
        migrations.AddField(
            model_name="pendingreview",
            name="checkpoint_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="pendingreview",
            index=models.Index(fields=["checkpoint_id"], name="pending_review_checkpoint"),
        ),
        migrations.RunPython(backfill_checkpoint_at, migrations.RunPython.noop),
    ]
