"""Lanes: a stream with its scratch and events, the order between streams, and what a
dispatch stages on a lane."""
