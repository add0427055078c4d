"""The breakers app's models, one module per domain; Django finds them all through here."""

# isort: off  (the order is the order of their foreign keys)
from breakers.models.checkpoints import (  # noqa: F401
    Checkpoint,
    CheckpointReason,
    CheckpointSet,
)
from breakers.models.control import (  # noqa: F401
    COMMAND_TRANSITIONS,
    OPEN_COMMAND_STATUSES,
    Command,
    CommandAck,
    CommandKind,
    CommandStatus,
    Hearing,
    WebBeacon,
)
from breakers.models.declarations import (  # noqa: F401
    BindingSource,
    CheckpointRoot,
    InferenceServer,
    NodeBinding,
)
from breakers.models.drills import (  # noqa: F401
    DRILL_TRANSITIONS,
    DrillCheck,
    DrillRun,
    DrillStatus,
    DrillWorkload,
)
from breakers.models.inference import (  # noqa: F401
    REPLICA_TRANSITIONS,
    InferenceReplica,
    ReplicaStatus,
)
from breakers.models.launchers import JobLauncher  # noqa: F401
from breakers.models.metrics import (  # noqa: F401
    CompactionCursor,
    EvaluationState,
    MetricBatch,
    MetricBlock,
    MetricPoint,
    MetricRollup,
    RankPaceHistory,
    RollupCursor,
    Rule,
)
from breakers.models.monitoring import (  # noqa: F401
    EXTERNAL_ALERT_TRANSITIONS,
    ExternalAlert,
    ExternalAlertStatus,
    IntegrationToken,
)
from breakers.models.rulesets import RuleSetVersion  # noqa: F401
from breakers.models.scheduler import (  # noqa: F401
    ExecutorKind,
    NodeDrain,
    SchedulerBinding,
)
from breakers.models.shadow import ShadowFiring  # noqa: F401
from breakers.models.snapshots import (  # noqa: F401
    EnvironmentSnapshot,
    SnapshotKind,
)

# isort: on

__all__ = [
    "CompactionCursor",
    "MetricBatch",
    "MetricBlock",
    "MetricPoint",
    "MetricRollup",
    "RankPaceHistory",
    "RollupCursor",
    "Rule",
    "EvaluationState",
    "CommandKind",
    "CommandStatus",
    "COMMAND_TRANSITIONS",
    "OPEN_COMMAND_STATUSES",
    "Command",
    "Hearing",
    "WebBeacon",
    "ExecutorKind",
    "SchedulerBinding",
    "NodeDrain",
    "SnapshotKind",
    "EnvironmentSnapshot",
    "Checkpoint",
    "CheckpointReason",
    "CheckpointSet",
    "JobLauncher",
    "IntegrationToken",
    "ExternalAlertStatus",
    "EXTERNAL_ALERT_TRANSITIONS",
    "ExternalAlert",
    "REPLICA_TRANSITIONS",
    "InferenceReplica",
    "ReplicaStatus",
    "DRILL_TRANSITIONS",
    "DrillCheck",
    "DrillRun",
    "DrillStatus",
    "RuleSetVersion",
    "ShadowFiring",
    "BindingSource",
    "CheckpointRoot",
    "InferenceServer",
    "NodeBinding",
]
