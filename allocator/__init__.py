"""Profiler-based resource allocation (StreamRL §4) and dynamic SGS scale-out.

Not built yet; the allocator issue fills this package."""
