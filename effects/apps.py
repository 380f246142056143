from django.apps import AppConfig


class EffectsConfig(AppConfig):
    name = "effects"
    verbose_name = "Effects and reconciliation"
