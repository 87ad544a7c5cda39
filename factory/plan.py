"""Segment planning: pure arithmetic over frame counts (no torch, no I/O).

A video of N frames is generated as segments of L frames. Segment 0 produces output
frames [0, L). Every later segment is conditioned on the last O frames of the one before
and so adds L - O new frames. A video shorter than one segment is one segment whose
frames past N are discarded; the last segment is generated at full length and trimmed.
"""

from __future__ import annotations

import math


def segment_count(frames_total: int, segment_frames: int, overlap: int) -> int:
    if frames_total < 1:
        raise ValueError(f"frames_total must be >= 1, got {frames_total}")
    if not 0 <= overlap < segment_frames:
        raise ValueError(f"need 0 <= overlap < segment_frames, got {overlap}, {segment_frames}")
    if frames_total <= segment_frames:
        return 1
    return 1 + math.ceil((frames_total - segment_frames) / (segment_frames - overlap))
