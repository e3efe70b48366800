"""Jobs and their scheduling: the scheduler's state machine, the dispatcher, the pending result."""
