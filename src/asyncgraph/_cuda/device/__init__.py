"""One device's resources: its context, lanes, memory, pinned pool, events and reactor,
set up and torn down; spare storage kept for reuse."""
