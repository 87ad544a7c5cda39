from __future__ import annotations

import numpy as np

from factory.generate import SegmentSpec, segment_seed
from factory.generate.procedural import ProceduralGenerator

W, H = 256, 144


def make(index=0, frames=24, first=0, context=0, prompt="A harbor at dawn", ctx=None, seed=1):
    gen = ProceduralGenerator()
    spec = SegmentSpec(index, frames, W, H, 24, first, context)
    return gen.generate(spec, gen.encode_prompt(prompt), ctx, seed)


def test_deterministic():
    assert np.array_equal(make(), make())
    assert not np.array_equal(make(seed=1), make(seed=2))


def test_moves_but_is_no_noise():
    frames = make(frames=48).astype(np.int16)
    motion = np.abs(np.diff(frames[:, :100], axis=0)).mean(axis=(1, 2, 3))
    assert motion.min() > 0.03  # every frame differs from the one before
    assert motion.max() < 1.0  # and nothing jumps
    assert np.abs(frames[-1, :100] - frames[0, :100]).mean() > 2  # and it goes somewhere
    # Neighbouring pixels are alike (a picture), unlike noise where they differ by ~85.
    spatial = np.abs(np.diff(frames[0, :100], axis=1)).mean()
    assert spatial < 6


def test_prompt_decides_the_picture():
    a, b = make(prompt="A harbor at dawn"), make(prompt="A city at night")
    assert np.abs(a.astype(int) - b.astype(int)).mean() > 20


def test_continues_the_context_it_is_given():
    first = make(frames=24)
    tail = first[-6:]
    follow = make(index=1, frames=24, first=18, context=6, ctx=tail, seed=2)
    unconditioned = make(index=1, frames=24, first=18, context=0, prompt="A city at night", seed=2)
    conditioned = make(index=1, frames=24, first=18, context=6, ctx=tail, prompt="A city at night",
                       seed=2)  # fmt: skip
    # The overlap reproduces the context (up to the segment's colour cast and grain).
    assert np.abs(follow[:6, :100].astype(int) - tail[:, :100].astype(int)).mean() < 10
    # Even a different scene starts from the context and only then turns into itself.
    start_gap = np.abs(conditioned[6, :100].astype(int) - tail[-1, :100].astype(int)).mean()
    free_gap = np.abs(unconditioned[6, :100].astype(int) - tail[-1, :100].astype(int)).mean()
    assert start_gap < free_gap / 2


def test_the_scene_prompt_is_written_on_it():
    frames = make(frames=2)
    caption_rows = frames[0, -30:].astype(int)
    assert (caption_rows > 200).mean() > 0.01  # bright text pixels in the caption band
    assert (frames[0, :60].astype(int) > 200).mean() == 0  # and none above it


def test_segment_seeds_are_stable_and_distinct():
    assert segment_seed(7, 3) == segment_seed(7, 3)
    assert len({segment_seed(7, k) for k in range(100)}) == 100
    assert segment_seed(7, 3, regeneration=1) != segment_seed(7, 3)
