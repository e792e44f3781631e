"""The SQL seam: the queue's database, the procedure calls, INSERTs and reads, install, migrations."""
