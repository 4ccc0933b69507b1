"""Interval arithmetic for the stage timeline: busy and idle time of each stage (pure)."""

from __future__ import annotations


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end] intervals (inputs with end < start are ignored)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] >= i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def covered(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of ``window`` covered by the union of ``intervals``."""
    lo, hi = window
    total = 0.0
    for start, end in union(intervals):
        total += max(0.0, min(end, hi) - max(start, lo))
    return total


def idle(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of ``window`` in which no interval is active."""
    return max(0.0, (window[1] - window[0]) - covered(intervals, window))


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Length of the intersection of two intervals (0 if disjoint)."""
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
