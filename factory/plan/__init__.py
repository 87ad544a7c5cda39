"""Planning, pure (no store, no database, no ffmpeg): a video's segments (segments.py) and the
plan the workers follow (video.py), its encode chunks and their keyframes (chunks.py), and a
redo's segments, join and chunks (redo.py)."""
