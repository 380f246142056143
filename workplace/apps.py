from django.apps import AppConfig


class WorkplaceConfig(AppConfig):
    """Every admin page of every app: the review page, the queue, the history, the records."""

    name = "workplace"
    label = "workplace"
    verbose_name = "Workplace"
