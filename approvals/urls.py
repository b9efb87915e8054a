from django.urls import path

from . import views

app_name = "approvals"

urlpatterns = [
    path("", views.approval_list, name="list"),
    path("<slug:slug>/<str:request_id>/", views.approval_detail, name="detail"),
    path("<slug:slug>/<str:request_id>/all/", views.approval_answer_all, name="answer_all"),
]
