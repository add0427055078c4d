"""The REST API's routes (``/api/v1/…``), grouped by the resource they act on."""

from django.urls import path

from console.api import (
    actions,
    agent,
    agent_bundle,
    alerts,
    audit,
    checkpoints,
    declarations,
    drills,
    escalations,
    health,
    incidents,
    inference,
    integrations,
    jobs,
    ledger,
    nodes,
    notifications,
    recoveries,
    reviews,
    rules,
    series,
    shadow,
    silences,
    snapshots,
    teams,
    tokens,
)

V1 = "api/v1"

# What training agents call (docs/protocol.md), with the job's agent token.
agent_routes = [
    path(f"{V1}/agent/metrics", agent.MetricsView.as_view(), name="agent-metrics"),
    path(f"{V1}/agent/heartbeat", agent.HeartbeatView.as_view(), name="agent-heartbeat"),
    path(
        f"{V1}/agent/commands/<int:command_id>/ack",
        agent.CommandAckView.as_view(),
        name="agent-command-ack",
    ),
    path(f"{V1}/agent/bundle", agent_bundle.BundleView.as_view(), name="agent-bundle"),
    path(f"{V1}/agent/snapshots", snapshots.SnapshotView.as_view(), name="agent-snapshots"),
    path(
        f"{V1}/agent/checkpoints",
        checkpoints.AgentCheckpointView.as_view(),
        name="agent-checkpoints",
    ),
    path(
        f"{V1}/agent/replicas/heartbeat",
        inference.ReplicaHeartbeatView.as_view(),
        name="agent-replica-heartbeat",
    ),
]

job_routes = [
    path(f"{V1}/jobs", jobs.JobListView.as_view(), name="job-list"),
    path(f"{V1}/jobs/<int:pk>", jobs.JobDetailView.as_view(), name="job-detail"),
    path(f"{V1}/jobs/<int:pk>/series", series.SeriesView.as_view(), name="job-series"),
    path(f"{V1}/jobs/<int:pk>/markers", series.MarkersView.as_view(), name="job-markers"),
    path(
        f"{V1}/jobs/<int:pk>/checkpoints",
        checkpoints.JobCheckpointsView.as_view(),
        name="job-checkpoints",
    ),
    path(f"{V1}/jobs/<int:pk>/pause", actions.PauseJobView.as_view(), name="job-pause"),
    path(
        f"{V1}/jobs/<int:pk>/pause/reason",
        actions.PauseReasonView.as_view(),
        name="job-pause-reason",
    ),
    path(f"{V1}/jobs/<int:pk>/resume", actions.ResumeJobView.as_view(), name="job-resume"),
    path(f"{V1}/jobs/<int:pk>/terminate", actions.TerminateJobView.as_view(), name="job-terminate"),
    path(
        f"{V1}/jobs/<int:pk>/confirm-pause",
        actions.ConfirmPauseView.as_view(),
        name="job-confirm-pause",
    ),
    path(
        f"{V1}/jobs/<int:pk>/ask-confirmation",
        notifications.AskConfirmationView.as_view(),
        name="job-ask-confirmation",
    ),
    path(f"{V1}/jobs/<int:pk>/mitigate", actions.MitigateJobView.as_view(), name="job-mitigate"),
    path(
        f"{V1}/jobs/<int:pk>/snapshots",
        snapshots.JobSnapshotListView.as_view(),
        name="job-snapshots",
    ),
    path(
        f"{V1}/jobs/<int:pk>/snapshots/diff",
        snapshots.JobSnapshotDiffView.as_view(),
        name="job-snapshot-diff",
    ),
    path(
        f"{V1}/jobs/<int:pk>/readiness", snapshots.JobReadinessView.as_view(), name="job-readiness"
    ),
    path(
        f"{V1}/jobs/<int:pk>/isolate-node",
        actions.IsolateNodeView.as_view(),
        name="job-isolate-node",
    ),
]

node_routes = [
    path(f"{V1}/nodes/<int:pk>", nodes.NodeDetailView.as_view(), name="node-detail"),
    path(f"{V1}/nodes/<int:pk>/resume", nodes.ResumeNodeView.as_view(), name="node-resume"),
]

alert_routes = [
    path(f"{V1}/alerts", alerts.AlertListView.as_view(), name="alert-list"),
    path(f"{V1}/alerts/<int:pk>", alerts.AlertDetailView.as_view(), name="alert-detail"),
    path(
        f"{V1}/alerts/<int:pk>/acknowledge",
        alerts.AcknowledgeAlertView.as_view(),
        name="alert-acknowledge",
    ),
    path(f"{V1}/alerts/<int:pk>/snooze", alerts.SnoozeAlertView.as_view(), name="alert-snooze"),
    path(
        f"{V1}/alerts/<int:pk>/deliveries",
        notifications.AlertDeliveriesView.as_view(),
        name="alert-deliveries",
    ),
]

escalation_routes = [
    path(f"{V1}/escalations", escalations.EscalationListView.as_view(), name="escalation-list"),
    path(
        f"{V1}/escalations/<int:pk>",
        escalations.EscalationDetailView.as_view(),
        name="escalation-detail",
    ),
    path(
        f"{V1}/escalations/<int:pk>/approve",
        escalations.ApproveEscalationView.as_view(),
        name="escalation-approve",
    ),
    path(
        f"{V1}/escalations/<int:pk>/reject",
        escalations.RejectEscalationView.as_view(),
        name="escalation-reject",
    ),
]

incident_routes = [
    path(
        f"{V1}/incidents/<int:pk>/acknowledge",
        incidents.AcknowledgeIncidentView.as_view(),
        name="incident-acknowledge",
    ),
    path(
        f"{V1}/incidents/<int:pk>/assign",
        incidents.AssignIncidentView.as_view(),
        name="incident-assign",
    ),
    path(f"{V1}/incidents/<int:pk>/notes", incidents.NotesView.as_view(), name="incident-notes"),
    path(
        f"{V1}/incidents/<int:pk>/recoveries",
        recoveries.RecoveriesView.as_view(),
        name="incident-recoveries",
    ),
    path(
        f"{V1}/incidents/<int:pk>/take-over",
        recoveries.TakeOverView.as_view(),
        name="incident-take-over",
    ),
    path(f"{V1}/incidents/<int:pk>/review", reviews.ReviewView.as_view(), name="review-api"),
    path(
        f"{V1}/incidents/<int:pk>/review.md",
        reviews.ReviewMarkdownExportView.as_view(),
        name="review-markdown",
    ),
    path(
        f"{V1}/incidents/<int:pk>/review.json",
        reviews.ReviewJsonExportView.as_view(),
        name="review-json",
    ),
]

team_routes = [
    path(f"{V1}/teams/<int:pk>/shifts", teams.ShiftListView.as_view(), name="team-shifts"),
    path(
        f"{V1}/teams/<int:pk>/shifts/<int:shift_id>",
        teams.ShiftDetailView.as_view(),
        name="team-shift-detail",
    ),
    path(f"{V1}/teams/<int:pk>/oncall", teams.OnCallNowView.as_view(), name="team-oncall"),
    path(f"{V1}/teams/<int:pk>/rotations", teams.RotationListView.as_view(), name="team-rotations"),
    path(
        f"{V1}/teams/<int:pk>/rotations/<int:rotation_id>",
        teams.RotationDetailView.as_view(),
        name="team-rotation-detail",
    ),
    path(
        f"{V1}/teams/<int:pk>/incident-report",
        reviews.TeamIncidentReportView.as_view(),
        name="team-incident-report",
    ),
    path(
        f"{V1}/teams/<int:pk>/notification-policy",
        notifications.PolicyView.as_view(),
        name="team-notification-policy",
    ),
    path(
        f"{V1}/teams/<int:pk>/contacts/<int:user_id>",
        notifications.ContactView.as_view(),
        name="team-contact",
    ),
    path(
        f"{V1}/teams/<int:pk>/test-notification",
        notifications.TestNotificationView.as_view(),
        name="team-test-notification",
    ),
    path(f"{V1}/teams/<int:pk>/rules", rules.RuleSetView.as_view(), name="team-rules"),
    path(
        f"{V1}/teams/<int:pk>/rules/versions",
        rules.VersionListView.as_view(),
        name="team-rule-versions",
    ),
    path(
        f"{V1}/teams/<int:pk>/rules/versions/<int:number>",
        rules.VersionView.as_view(),
        name="team-rule-version",
    ),
    path(f"{V1}/teams/<int:pk>/ledger", ledger.GoodputLedgerView.as_view(), name="team-ledger"),
    path(
        f"{V1}/teams/<int:pk>/ledger.csv",
        ledger.GoodputLedgerCsvView.as_view(),
        name="team-ledger-csv",
    ),
    path(
        f"{V1}/teams/<int:pk>/rules/shadow",
        shadow.ShadowReportView.as_view(),
        name="team-rules-shadow",
    ),
    path(
        f"{V1}/teams/<int:pk>/rules/<slug:key>/promote",
        shadow.PromoteView.as_view(),
        name="team-rule-promote",
    ),
]

# Fire drills (docs/drills.md).
drill_routes = [
    path(f"{V1}/teams/<int:pk>/drills", drills.TeamDrillsView.as_view(), name="team-drills"),
    path(f"{V1}/drills/<int:pk>", drills.DrillDetailView.as_view(), name="drill-detail"),
    path(
        f"{V1}/teams/<int:pk>/drill-workload",
        drills.TeamWorkloadView.as_view(),
        name="team-drill-workload",
    ),
]

silence_routes = [
    path(f"{V1}/silences", silences.SilenceListView.as_view(), name="silence-list"),
    path(f"{V1}/silences/<int:pk>/end", silences.EndSilenceView.as_view(), name="silence-end"),
]

# The person's own things, the system's health, and the providers' delivery receipts.
other_routes = [
    path(f"{V1}/tokens", tokens.TokenListView.as_view(), name="token-list"),
    path(f"{V1}/tokens/<int:pk>", tokens.TokenRevokeView.as_view(), name="token-detail"),
    path(f"{V1}/audit", audit.AuditListView.as_view(), name="audit-list"),
    path(f"{V1}/health", health.HealthView.as_view(), name="health"),
    path(
        f"{V1}/notifications/receipts",
        notifications.ReceiptView.as_view(),
        name="notification-receipts",
    ),
    path(
        f"{V1}/notifications/replies/sms",
        notifications.SmsReplyView.as_view(),
        name="notification-reply-sms",
    ),
    path(
        f"{V1}/notifications/replies/phone",
        notifications.PhoneReplyView.as_view(),
        name="notification-reply-phone",
    ),
]

# The cluster's monitoring (docs/monitoring.md).
integration_routes = [
    path(
        f"{V1}/integrations/alertmanager",
        integrations.AlertmanagerWebhookView.as_view(),
        name="integrations-alertmanager",
    ),
    path(
        f"{V1}/integrations/alertmanager/unrouted",
        integrations.UnroutedAlertListView.as_view(),
        name="integrations-unrouted",
    ),
    path(
        f"{V1}/teams/<int:pk>/integration-tokens",
        integrations.IntegrationTokenListView.as_view(),
        name="integration-token-list",
    ),
    path(
        f"{V1}/integration-tokens/<int:pk>",
        integrations.IntegrationTokenView.as_view(),
        name="integration-token-detail",
    ),
]

# What is a job's, declared by a team admin (docs/security.md "Declarations").
declaration_routes = [
    path(
        f"{V1}/jobs/<int:pk>/inference-servers",
        declarations.InferenceServersView.as_view(),
        name="job-inference-servers",
    ),
    path(
        f"{V1}/jobs/<int:pk>/checkpoint-root",
        declarations.JobCheckpointRootView.as_view(),
        name="job-checkpoint-root",
    ),
    path(f"{V1}/jobs/<int:pk>/size", declarations.JobSizeView.as_view(), name="job-size"),
    path(
        f"{V1}/teams/<int:pk>/checkpoint-root",
        declarations.TeamCheckpointRootView.as_view(),
        name="team-checkpoint-root",
    ),
]

urlpatterns = [
    *agent_routes,
    *job_routes,
    *node_routes,
    *alert_routes,
    *escalation_routes,
    *incident_routes,
    *team_routes,
    *silence_routes,
    *drill_routes,
    *declaration_routes,
    *other_routes,
    *integration_routes,
]
