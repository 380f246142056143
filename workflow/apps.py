from django.apps import AppConfig


class WorkflowConfig(AppConfig):
    name = "workflow"
    label = "workflow"
    verbose_name = "Review workflow"
