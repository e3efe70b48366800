"""The front: what a user touches (the backend, its life, its options, its transfers), the
dispatcher that performs the scheduler's effects, and the protocols engines meet."""
