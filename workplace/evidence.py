"""Sources and their versions in the admin, view-only.

They come from the pipeline's import (``load_case``) and are never edited here. The case
list, with its review status and bulk decisions, belongs to the review workplace
(``workplace/review.py``), which sits above the data it shows.
"""

from __future__ import annotations

from django.contrib import admin

from workplace.display import ViewOnlyAdmin, pre_html


class SourceAdmin(ViewOnlyAdmin):
    list_display = ("source_id", "title")
    search_fields = ("=source_id", "title")
    list_per_page = 100


class SourceVersionAdmin(ViewOnlyAdmin):
    list_display = ("source_id", "version", "source_title")
    list_select_related = ("source",)
    search_fields = ("=source__source_id",)
    list_per_page = 100
    fields = ("source", "version", "text_pre")
    readonly_fields = ("text_pre",)

    def get_queryset(self, request):
        # Full texts are read only on the detail page.
        return super().get_queryset(request).defer("text")

    @admin.display(description="source", ordering="source__source_id")
    def source_id(self, obj):
        return obj.source.source_id

    @admin.display(description="title")
    def source_title(self, obj):
        return obj.source.title

    @admin.display(description="full text")
    def text_pre(self, obj):
        return pre_html(obj.text)
