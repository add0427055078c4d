from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import views
from console.api import actions, agent, alerts, audit, escalations, health, jobs, teams, tokens
from console.api.snapshots import SnapshotView

api_v1 = [
    path("api/v1/agent/metrics", agent.MetricsView.as_view(), name="agent-metrics"),
    path("api/v1/agent/heartbeat", agent.HeartbeatView.as_view(), name="agent-heartbeat"),
    path(
        "api/v1/agent/commands/<int:command_id>/ack",
        agent.CommandAckView.as_view(),
        name="agent-command-ack",
    ),
    path("api/v1/agent/snapshots", SnapshotView.as_view(), name="agent-snapshots"),
    path("api/v1/health", health.HealthView.as_view(), name="health"),
    path("api/v1/jobs", jobs.JobListView.as_view(), name="job-list"),
    path("api/v1/jobs/<int:pk>", jobs.JobDetailView.as_view(), name="job-detail"),
]

# The authorisation chain (issue 6): people acting on their teams' jobs, alerts and requests.
api_v1 += [
    path("api/v1/jobs/<int:pk>/pause", actions.PauseJobView.as_view(), name="job-pause"),
    path("api/v1/jobs/<int:pk>/resume", actions.ResumeJobView.as_view(), name="job-resume"),
    path(
        "api/v1/jobs/<int:pk>/terminate", actions.TerminateJobView.as_view(), name="job-terminate"
    ),
    path(
        "api/v1/jobs/<int:pk>/confirm-pause",
        actions.ConfirmPauseView.as_view(),
        name="job-confirm-pause",
    ),
    path("api/v1/jobs/<int:pk>/mitigate", actions.MitigateJobView.as_view(), name="job-mitigate"),
    path(
        "api/v1/jobs/<int:pk>/isolate-node",
        actions.IsolateNodeView.as_view(),
        name="job-isolate-node",
    ),
    path("api/v1/alerts", alerts.AlertListView.as_view(), name="alert-list"),
    path("api/v1/alerts/<int:pk>", alerts.AlertDetailView.as_view(), name="alert-detail"),
    path(
        "api/v1/alerts/<int:pk>/acknowledge",
        alerts.AcknowledgeAlertView.as_view(),
        name="alert-acknowledge",
    ),
    path("api/v1/escalations", escalations.EscalationListView.as_view(), name="escalation-list"),
    path(
        "api/v1/escalations/<int:pk>",
        escalations.EscalationDetailView.as_view(),
        name="escalation-detail",
    ),
    path(
        "api/v1/escalations/<int:pk>/approve",
        escalations.ApproveEscalationView.as_view(),
        name="escalation-approve",
    ),
    path(
        "api/v1/escalations/<int:pk>/reject",
        escalations.RejectEscalationView.as_view(),
        name="escalation-reject",
    ),
    path("api/v1/audit", audit.AuditListView.as_view(), name="audit-list"),
    path("api/v1/teams/<int:pk>/shifts", teams.ShiftListView.as_view(), name="team-shifts"),
    path(
        "api/v1/teams/<int:pk>/shifts/<int:shift_id>",
        teams.ShiftDetailView.as_view(),
        name="team-shift-detail",
    ),
    path("api/v1/teams/<int:pk>/oncall", teams.OnCallNowView.as_view(), name="team-oncall"),
    path("api/v1/tokens", tokens.TokenListView.as_view(), name="token-list"),
    path("api/v1/tokens/<int:pk>", tokens.TokenRevokeView.as_view(), name="token-detail"),
]

# The live console (issue 7): chart history and markers.
from console.api import series  # noqa: E402

api_v1 += [
    path("api/v1/jobs/<int:pk>/series", series.SeriesView.as_view(), name="job-series"),
    path("api/v1/jobs/<int:pk>/markers", series.MarkersView.as_view(), name="job-markers"),
]

urlpatterns = [
    *api_v1,
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("jobs/<int:pk>/", views.job_page, name="job-page"),
    path("alerts/", views.alerts_page, name="alerts-page"),
    path("approvals/", views.approvals_page, name="approvals-page"),
    path("incidents/<int:pk>/", views.incident_page, name="incident-page"),
]

# Post-incident reviews (issue 9): the write-up API, its exports, the team report, the pages.
from console import review_views  # noqa: E402
from console.api import reviews  # noqa: E402

urlpatterns += [
    path("api/v1/incidents/<int:pk>/review", reviews.ReviewView.as_view(), name="review-api"),
    path(
        "api/v1/incidents/<int:pk>/review.md",
        reviews.ReviewMarkdownExportView.as_view(),
        name="review-markdown",
    ),
    path(
        "api/v1/incidents/<int:pk>/review.json",
        reviews.ReviewJsonExportView.as_view(),
        name="review-json",
    ),
    path(
        "api/v1/teams/<int:pk>/incident-report",
        reviews.TeamIncidentReportView.as_view(),
        name="team-incident-report",
    ),
    path("incidents/<int:pk>/review/", review_views.incident_review, name="incident-review"),
    path("teams/<int:pk>/report/", review_views.team_report, name="team-report"),
]

# Jobs on Slurm (issue 10): a node's drain state, and a manager returning it to service.
from console.api import nodes  # noqa: E402

urlpatterns += [
    path("api/v1/nodes/<int:pk>", nodes.NodeDetailView.as_view(), name="node-detail"),
    path("api/v1/nodes/<int:pk>/resume", nodes.ResumeNodeView.as_view(), name="node-resume"),
]

# Notifications (issue 8): the team's policy, contacts, test messages, an alert's deliveries.
from console.api import notifications  # noqa: E402

urlpatterns += [
    path(
        "api/v1/teams/<int:pk>/notification-policy",
        notifications.PolicyView.as_view(),
        name="team-notification-policy",
    ),
    path(
        "api/v1/teams/<int:pk>/contacts/<int:user_id>",
        notifications.ContactView.as_view(),
        name="team-contact",
    ),
    path(
        "api/v1/teams/<int:pk>/test-notification",
        notifications.TestNotificationView.as_view(),
        name="team-test-notification",
    ),
    path(
        "api/v1/alerts/<int:pk>/deliveries",
        notifications.AlertDeliveriesView.as_view(),
        name="alert-deliveries",
    ),
    path(
        "api/v1/notifications/receipts",
        notifications.ReceiptView.as_view(),
        name="notification-receipts",
    ),
]
