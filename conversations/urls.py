from django.urls import path

from conversations import archive_views, document_views, search_views, share_views, views

app_name = "conversations"
urlpatterns = [
    path("", views.chat_new, name="new"),
    path("search/", search_views.search, name="search"),
    path("export/", archive_views.export_all, name="export_all"),
    path("import/", archive_views.import_page, name="import"),
    path("documents/", document_views.document_upload, name="document_upload_new"),
    path("documents/<int:document_id>/delete/", document_views.document_delete, name="document_delete"),
    path("passages/<int:chunk_id>/", document_views.passage, name="passage"),
    path("<int:conversation_id>/", views.chat_detail, name="detail"),
    path("<int:conversation_id>/messages/", views.chat_messages, name="messages"),
    path("<int:conversation_id>/branch/", views.chat_branch, name="branch"),
    path("<int:conversation_id>/rename/", views.chat_rename, name="rename"),
    path("<int:conversation_id>/delete/", views.chat_delete, name="delete"),
    path("<int:conversation_id>/system-prompt/", views.chat_system_prompt, name="system_prompt"),
    path("<int:conversation_id>/documents/", document_views.document_list, name="documents"),
    path("<int:conversation_id>/documents/upload/", document_views.document_upload, name="document_upload"),
    path("<int:conversation_id>/memory/", views.chat_memory, name="memory"),
    path("<int:conversation_id>/export/", archive_views.export_one, name="export"),
    path("<int:conversation_id>/share/", share_views.share_create, name="share"),
    path("shares/<int:link_id>/revoke/", share_views.share_revoke, name="share_revoke"),
]
