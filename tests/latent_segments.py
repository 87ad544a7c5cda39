"""Generate segments of a latent family in this process, continuing from a stored carry: the
cold-worker half of the resume tests (`python -m tests.latent_segments FAMILY DIR OUT 2,3`).

Each segment k writes OUT/frames-k.npy and OUT/carry-k.safetensors; segment k > 0 reads
OUT/carry-(k-1).safetensors, which another process may have written."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from factory.generate import SegmentSpec, make_generator, segment_seed
from factory.spec import ModelChoice

WIDTH, HEIGHT, FPS, OVERLAP, JOB_SEED = 128, 64, 24, 8, 7
PROMPT, NEGATIVE = "a harbor at dawn with fog on the water", "blurry low quality flicker"


def chunk_frames(family: str) -> int:
    """New frames per segment: one Helios chunk, two AnyFlow-FAR chunks."""
    return 36 if family == "helios" else 24


def segment_spec(family: str, index: int) -> SegmentSpec:
    new = chunk_frames(family)
    context = OVERLAP if index else 0
    return SegmentSpec(index, new + context, WIDTH, HEIGHT, FPS, index * new, context)


def loaded(family: str, model_dir: str):  # type: ignore[no-untyped-def]
    generator = make_generator(ModelChoice(family, model_dir, steps=2))
    generator.load("cpu")
    return generator


def run(family: str, model_dir: str, out: Path, indices: list[int]) -> None:
    generator = loaded(family, model_dir)
    prompt = generator.encode_prompt(PROMPT, NEGATIVE)
    for index in indices:
        carry_in = out / f"carry-{index - 1}.safetensors"
        carry = carry_in.read_bytes() if index else None
        frames, carried = generator.generate_continuing(
            segment_spec(family, index), prompt, carry, segment_seed(JOB_SEED, index)
        )
        np.save(out / f"frames-{index}.npy", frames)
        (out / f"carry-{index}.safetensors").write_bytes(carried)


if __name__ == "__main__":
    family, model_dir, out, indices = sys.argv[1:5]
    run(family, model_dir, Path(out), [int(i) for i in indices.split(",")])
