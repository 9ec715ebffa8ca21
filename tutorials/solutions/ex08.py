"""Lesson 8: reference solutions."""


def _overlap(a, b):
    return a[0] <= b[1] and b[0] <= a[1]


def place_first_fit(sizes, intervals):
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    offsets = [None] * len(sizes)
    for i in order:
        busy = sorted(
            (offsets[j], offsets[j] + sizes[j])
            for j in range(len(sizes))
            if offsets[j] is not None and _overlap(intervals[i], intervals[j])
        )
        off = 0
        for start, end in busy:
            if off + sizes[i] <= start:
                break
            off = max(off, end)
        offsets[i] = off
    return offsets


def peak_live(sizes, intervals, n_steps):
    return max(sum(s for s, (a, b) in zip(sizes, intervals) if a <= t <= b) for t in range(n_steps))
