from django.apps import AppConfig


class WorkflowConfig(AppConfig):
    name = "decisionflow.workflow"
    label = "workflow"
    verbose_name = "Review workflow"
