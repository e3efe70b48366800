"""The front: what a user touches (the backend, its life, its options), and the protocols engines
meet."""
