"""A dispatch's arguments: kernels and their parameters, argument kinds, binding, and cached
plans."""
