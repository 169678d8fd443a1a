"""Errors of the TransferQueue client; each message says what to change."""

from __future__ import annotations

from asyncflow.core.errors import AsyncflowError


class BatchTimeout(AsyncflowError, TimeoutError):
    """No batch was ready in time; the message names the task, the missing columns
    and how many rows were ready."""


class QueueFull(AsyncflowError, TimeoutError):
    """An allocation waited its whole timeout for capacity; the message names the
    tasks that hold rows back."""
