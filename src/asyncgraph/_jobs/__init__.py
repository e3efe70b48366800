"""Jobs and their scheduling: the scheduler's state machine, priority classes, withdrawal, the
pending result. It knows no engine: the dispatcher that performs its effects is the front's."""
