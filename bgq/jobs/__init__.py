"""A job's life below the modes: published, sent, run, heartbeated, reaped, scheduled, administered."""
