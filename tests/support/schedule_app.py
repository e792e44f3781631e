"""The application the schedule tests run with `bgq --app tests.support.schedule_app:queue work`.

Configured by environment variables (set by tests/test_schedules.py): BGQ_TEST_SCHED_URL,
BGQ_TEST_SCHED_TABLE (the installed test table) and BGQ_TEST_SCHED_HOST (a label: the tests run
two groups of processes as two "hosts"). It declares one schedule, `every2s`, firing every 2 s.
"""

from __future__ import annotations

import os

from bgq import Queue

queue = Queue(
    database_url=os.environ["BGQ_TEST_SCHED_URL"],
    table_name=os.environ["BGQ_TEST_SCHED_TABLE"],
    queue="sched",
    callbacks={"tick": lambda host=None: None},
)
queue.schedule("every2s", "*/2 * * * * *", "tick")
