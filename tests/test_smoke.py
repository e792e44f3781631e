"""The canonical serial group on each dialect through the public API (seed Test 2b)."""

from __future__ import annotations

from bgq import JobState
from tests.support.clock import Clock
from tests.support.helpers import state_of


def test_canonical_order_in_cron_mode(make_queue, installed):
    """Checklist 51: a1 b1 c2 d1 e1 f2 g1 in one group runs as a b d e g c f; 53: never two at once."""
    order: list[str] = []
    overlaps: list[str] = []

    def record(mark: str) -> None:
        running = installed.sql("SELECT COUNT(*) AS n FROM {t} WHERE state = 2 AND serial_group IS NOT NULL")
        if running[0]["n"] != 1:
            overlaps.append(mark)
        order.append(mark)

    clock = Clock()
    queue = make_queue(callbacks={"record": record}, priorities=[1, 2], clock=clock)
    ids = [
        queue.publish("record", [m[0]], serial_group="transcribe", priority=int(m[1]))
        for m in ("a1", "b1", "c2", "d1", "e1", "f2", "g1")
    ]
    for _ in range(20):
        queue.process()
        if all(state_of(installed, i) == JobState.FINISHED for i in ids):
            break
        clock.advance(1.05)  # past waiting_job_expiration, should a job have turned WAITING
    assert order == list("abdegcf")
    assert overlaps == []
