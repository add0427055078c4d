"""The console's routes: the REST API (``console.api.urls``), its schema, the pages, the admin
and signing in."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from console import metrics_endpoint
from console.pages import (
    acknowledge,
    drills,
    jobs,
    lists,
    monitoring,
    outbox,
    reviews,
    rules,
    snapshots,
    teams,
)

urlpatterns = [
    path("", include("console.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", jobs.ApiDocsView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", jobs.dashboard, name="dashboard"),
    path("jobs/<int:pk>/", jobs.job_page, name="job-page"),
    path("jobs/<int:pk>/snapshots/", snapshots.job_snapshots_page, name="job-snapshots-page"),
    path("alerts/", jobs.alerts_page, name="alerts-page"),
    path("approvals/", jobs.approvals_page, name="approvals-page"),
    path("incidents/<int:pk>/", jobs.incident_page, name="incident-page"),
    path("incidents/<int:pk>/review/", reviews.incident_review, name="incident-review"),
    path("teams/<int:pk>/report/", reviews.team_report, name="team-report"),
    path("monitoring/", monitoring.monitoring_page, name="monitoring-page"),
    path("metrics", metrics_endpoint.metrics, name="metrics"),
    path("teams/", teams.teams_page, name="teams-page"),
    path("teams/<int:pk>/paging/", teams.paging_page, name="team-paging"),
    path("teams/<int:pk>/rules/", rules.rules_page, name="team-rules-page"),
    path("teams/<int:pk>/drills/", drills.team_drills_page, name="team-drills-page"),
    path("drills/<int:pk>/", drills.drill_page, name="drill-page"),
    path("silences/", lists.silences_page, name="silences-page"),
    path("incidents/", lists.incidents_page, name="incidents-page"),
    path("audit/", lists.audit_page, name="audit-page"),
    path("outbox/", outbox.outbox_page, name="outbox-page"),
    path("ack/<str:token>/", acknowledge.acknowledge_link_page, name="acknowledge-link"),
]
