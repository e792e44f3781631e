"""bgq's fault-injection harness (`make chaos`): real workers and faults, judged on a ledger."""
