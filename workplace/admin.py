"""Every admin page of every app, registered in one place.

Django's admin imports this module when the URLs load (decisionflow/urls.py), not at start-up,
so that the pages may import the workflow, and through it the engine, directly: no cron
command loads them. The API's own page (its tokens) is registered by ``api/admin.py``.
"""

from django.contrib import admin

from audit.models import SignedExport
from cases.models import Case, Policy, Source, SourceVersion
from effects.models import CommitAttempt, Delivery, EffectRecord
from reviews.models import Notification, PendingReview, Proposal, ReviewDecision, ReviewQueueItem, WorkflowCheckpoint

from .deliveries import DeliveryAdmin
from .effects import CommitAttemptAdmin, EffectRecordAdmin
from .evidence import SourceAdmin, SourceVersionAdmin
from .exports import SignedExportAdmin
from .policies import PolicyAdmin
from .queue import ReviewQueueAdmin
from .records import NotificationAdmin, PendingReviewAdmin, ReviewDecisionAdmin, WorkflowCheckpointAdmin
from .review import CaseAdmin, ProposalAdmin

admin.site.site_header = "decisionflow review"
admin.site.site_title = "decisionflow"
admin.site.index_title = "Reviews, cases and the effect store"
# The admin is the whole site: Django's "View site" would lead back to /admin/. The top bar
# links the review queue instead (admin/base_site.html).
admin.site.site_url = None

for model, page in (
    (Case, CaseAdmin),
    (Proposal, ProposalAdmin),
    (ReviewQueueItem, ReviewQueueAdmin),
    (Source, SourceAdmin),
    (SourceVersion, SourceVersionAdmin),
    (Policy, PolicyAdmin),
    (ReviewDecision, ReviewDecisionAdmin),
    (PendingReview, PendingReviewAdmin),
    (WorkflowCheckpoint, WorkflowCheckpointAdmin),
    (Notification, NotificationAdmin),
    (EffectRecord, EffectRecordAdmin),
    (CommitAttempt, CommitAttemptAdmin),
    (Delivery, DeliveryAdmin),
    (SignedExport, SignedExportAdmin),
):
    admin.site.register(model, page)
