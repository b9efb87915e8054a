import operator
from functools import reduce

from django.db import models
from django.db.models import Sum
from django.db.models.functions import Coalesce

# Every token counts toward the usage and the budget: input, output, cache reads and writes.
TOKEN_FIELDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write": "cache_write_tokens",
}
TOTAL_TOKENS = reduce(operator.add, (models.F(field) for field in TOKEN_FIELDS.values()))


def token_sums() -> dict:
    """Sum expressions of each kind of token and of their total, for aggregate or annotate."""
    return {name: Sum(field) for name, field in TOKEN_FIELDS.items()} | {"total": Sum(TOTAL_TOKENS)}


class ModelCallQuerySet(models.QuerySet):
    def tokens(self) -> dict:
        """Summed usage: input, output, cache_read, cache_write and total."""
        return self.aggregate(**{name: Coalesce(s, 0) for name, s in token_sums().items()})


class ModelCall(models.Model):
    """One answer of the Messages API, kept under the request it answered.

    Written the moment the answer arrives, outside the run's transaction: the fence does not
    roll it back, so a run retried after a crash finds it and does not pay again, and the
    day's usage counts every token that was paid for, even by a run whose finish was refused.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="model_calls")
    # sha256 of the request (model, system, tools, messages, max_tokens) as canonical JSON.
    request_key = models.CharField(max_length=64)
    # The lease generation of the run that paid for it: one run, one generation.
    generation = models.PositiveBigIntegerField()
    model = models.CharField(max_length=100)
    stop_reason = models.CharField(max_length=50, blank=True)
    response = models.JSONField()
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    created = models.DateTimeField()

    objects = ModelCallQuerySet.as_manager()

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_modelcall"
        ordering = ["id"]
        constraints = [
            # The Claude agent's cache lookup, before every model call.
            models.UniqueConstraint(
                fields=["inbox", "request_key"], name="modelcall_unique_request"
            ),
        ]
        indexes = [
            # The budget check before every model call (one inbox's usage since midnight),
            # and the dashboard's usage per inbox.
            models.Index(fields=["inbox", "created"], name="modelcall_inbox_created_idx"),
        ]

    def __str__(self):
        return f"{self.model} for {self.inbox_id} gen {self.generation}"

    @property
    def total_tokens(self) -> int:
        return sum(getattr(self, field) for field in TOKEN_FIELDS.values())


class ToolResult(models.Model):
    """The result of one application tool call, kept under the call's idempotency key.

    Written the moment the tool returns, outside the run's transaction, like ModelCall: a
    run retried after a crash gives the model the result the tool gave the first time instead
    of running it again, so its next request is the same one and is answered from the cache.
    A crash between the tool's side effect and this row runs the tool again, with the same
    idempotency key.
    """

    inbox = models.ForeignKey("inbox.Inbox", on_delete=models.CASCADE, related_name="tool_results")
    idempotency_key = models.CharField(max_length=200)
    tool = models.CharField(max_length=64)
    arguments = models.JSONField(default=dict)
    result = models.JSONField()  # the tool_result block given to the model
    approved = models.BooleanField(default=False)
    generation = models.PositiveBigIntegerField()
    created = models.DateTimeField()

    class Meta:
        # The table it had in the project's first app: moved here without a copy.
        db_table = "alwayson_toolresult"
        ordering = ["id"]
        constraints = [
            # The Claude agent's lookup before running a tool.
            models.UniqueConstraint(
                fields=["inbox", "idempotency_key"], name="toolresult_unique_key"
            ),
        ]

    def __str__(self):
        return f"{self.tool} ({self.idempotency_key})"
