from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import views
from console.api import agent, health, jobs

api_v1 = [
    path("api/v1/agent/metrics", agent.MetricsView.as_view(), name="agent-metrics"),
    path("api/v1/agent/heartbeat", agent.HeartbeatView.as_view(), name="agent-heartbeat"),
    path(
        "api/v1/agent/commands/<int:command_id>/ack",
        agent.CommandAckView.as_view(),
        name="agent-command-ack",
    ),
    path("api/v1/health", health.HealthView.as_view(), name="health"),
    path("api/v1/jobs", jobs.JobListView.as_view(), name="job-list"),
    path("api/v1/jobs/<int:pk>", jobs.JobDetailView.as_view(), name="job-detail"),
]

urlpatterns = [
    *api_v1,
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
]
