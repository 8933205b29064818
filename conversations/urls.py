from django.urls import path

from conversations import views

app_name = "conversations"
urlpatterns = [
    path("", views.chat_new, name="new"),
    path("<int:conversation_id>/", views.chat_detail, name="detail"),
    path("<int:conversation_id>/rename/", views.chat_rename, name="rename"),
    path("<int:conversation_id>/delete/", views.chat_delete, name="delete"),
]
