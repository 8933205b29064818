from django.urls import path

from memory import views

app_name = "memory"
urlpatterns = [
    path("", views.memory_page, name="page"),
    path("switch/", views.account_switch, name="switch"),
    path("facts/", views.memory_add, name="add"),
    path("facts/<int:memory_id>/", views.memory_edit, name="edit"),
    path("facts/<int:memory_id>/delete/", views.memory_delete, name="delete"),
    path("forget-all/", views.forget_all, name="forget_all"),
    path("passages/<int:chunk_id>/forget/", views.chunk_forget, name="chunk_forget"),
]
