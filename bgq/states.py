"""Job states and publish modes, mirroring the CHECK constraints of db/<dialect>/schema.sql."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class JobState(IntEnum):
    BACK_TO_BROKER = -1
    READY = 1
    PROCESSING = 2
    FINISHED = 3
    TEMPORARILY_FAILED = 4
    PERMANENTLY_FAILED = 5
    WAITING = 6
    REDUNDANT = 7
    BROKER_FAILED = 8


#: States a claim accepts ("ready to process").
CLAIMABLE = frozenset(
    {
        JobState.BACK_TO_BROKER,
        JobState.READY,
        JobState.TEMPORARILY_FAILED,
        JobState.WAITING,
        JobState.BROKER_FAILED,
    }
)
#: States after which a job never runs again by itself.
TERMINAL = frozenset({JobState.FINISHED, JobState.REDUNDANT, JobState.PERMANENTLY_FAILED})


class Mode(StrEnum):
    NORMAL = "normal"
    UNIQUE = "unique"
    RECURRING = "recurring"
