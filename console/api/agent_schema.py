"""Serializers that *document* the agent protocol in OpenAPI.

The endpoints validate with ``breakers.agent.protocol`` (a fast loop, all-or-nothing); these
classes only describe the same shapes for /api/schema/ and are not used on the hot path.
"""

from __future__ import annotations

from rest_framework import serializers

from breakers.agent.protocol import MAX_STEP
from console.api.schema_fields import MetricValueField

MAX_INT32 = 2**31 - 1


class MetricPointDoc(serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text="Metric name, e.g. loss, grad_norm.")
    step = serializers.IntegerField(
        min_value=0, max_value=MAX_STEP, help_text="Training step, a whole number ≥ 0."
    )
    value = MetricValueField()
    time = serializers.DateTimeField(
        required=False, help_text="ISO 8601 with a time zone; server time when absent."
    )
    node = serializers.CharField(required=False, max_length=200, allow_null=True)


class MetricsBatchDoc(serializers.Serializer):
    batch = serializers.RegexField(
        r"^[A-Za-z0-9._:+/-]{1,128}$",
        max_length=128,
        required=False,
        allow_null=True,
        help_text="Protocol 2: the batch's id, the same on every retry; a batch id this job "
        "sent before is not stored again, and answers what its first copy stored.",
    )
    points = MetricPointDoc(
        many=True,
        help_text="At most 10,000 points and 4 MiB per request (413 above); accepted whole or "
        "refused whole.",
    )


class CommandDoc(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(
        choices=[
            "lower_lr",
            "pause_data",
            "checkpoint_and_pause",
            "resume",
            "terminate",
            "isolate_node",
            "inject_fault",
        ]
    )
    params = serializers.DictField()
    severity = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    issued_at = serializers.DateTimeField()


class MetricsAcceptedDoc(serializers.Serializer):
    accepted = serializers.IntegerField()
    commands = CommandDoc(many=True)


class HeartbeatDoc(serializers.Serializer):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    status = serializers.ChoiceField(choices=["running", "paused", "checkpointing", "finished"])
    pid = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_INT32,
        help_text="Process id, for the local executor.",
    )
    hostname = serializers.CharField(required=False)
    rank = serializers.IntegerField(required=False, min_value=0, max_value=MAX_INT32)
    world_size = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_INT32,
        help_text="WORLD_SIZE: how many ranks the job runs; above the rank.",
    )
    slurm_job_id = serializers.CharField(
        required=False, help_text="SLURM_JOB_ID: binds the job to the Slurm executor."
    )
    slurm_nodelist = serializers.CharField(required=False, help_text="SLURM_JOB_NODELIST.")
    slurm_step_id = serializers.CharField(
        required=False, help_text="SLURM_STEP_ID, inside an srun step (USR1 reaches every step)."
    )
    sync_step = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_STEP,
        help_text="The latest step whose gradient sync this rank entered: step + 1 while it "
        "waits in the next step's all-reduce (names the rank a hang waits for).",
    )
    compute_seconds = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=1e6,
        help_text="The rank's own work per step, the wait for the other ranks left out (the "
        "straggler check's basis): the mean over its steps since its previous heartbeat.",
    )


class CommandsDoc(serializers.Serializer):
    commands = CommandDoc(many=True)


class ErrorDoc(serializers.Serializer):
    error = serializers.CharField(help_text="A machine-readable code, e.g. invalid, unknown_token.")
    detail = serializers.CharField(help_text="A human sentence.")
    # A declared field named like a Serializer attribute: DRF's metaclass moves it into the
    # serializer's fields; the stubs see a class attribute overriding the base's.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.CharField(), help_text="Field path → what is wrong with it."
    )


class AckDoc(serializers.Serializer):
    status = serializers.ChoiceField(choices=["succeeded", "failed"])
    result = serializers.DictField(
        required=False,
        help_text="What it achieved: checkpoint path, bytes, seconds, sha256, step, new lrs.",
    )
    error = serializers.CharField(required=False, help_text="Why it failed.")


class AckedDoc(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
