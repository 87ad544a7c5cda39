"""Planning: pure arithmetic over a video's frames: its segments, chunks, keyframes and redos."""
