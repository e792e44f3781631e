"""Shared test helpers: rows and procedure calls by hand (helpers), the injected clock (clock), the
`bgq work` test application (work_app) and the ledger worker of the concurrency proofs (ledger_worker)."""
