"""Dynamic batching: many small awaits collected into one launch, of a kernel or any function."""
