"""The worker modes: one module per loop (bgq process, work, consume) and what only those loops share."""
