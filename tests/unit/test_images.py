"""Pictures a manifest brings (factory/media/images.py): what is refused (another format, a
file that does not decode, too large, a decompression bomb), how every colour form becomes
8-bit RGB, and the two size rules."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from factory.media.images import MAX_IMAGE_BYTES, image_problem, load_image


def save(path: Path, picture: Image.Image, fmt: str, **options) -> Path:
    picture.save(path, fmt, **options)
    return path


def test_the_formats_it_takes_and_what_it_refuses(tmp_path: Path):
    red = Image.new("RGB", (32, 16), (200, 10, 10))
    for fmt in ("PNG", "JPEG", "WEBP"):
        assert image_problem(save(tmp_path / f"p.{fmt.lower()}", red, fmt)) is None
    refused = "is not a picture (PNG, JPEG or WebP: its bytes are none of them)"
    assert image_problem(save(tmp_path / "p.gif", red, "GIF")) == refused
    (tmp_path / "notes.png").write_text("not a picture at all")  # the name says nothing
    assert image_problem(tmp_path / "notes.png") == refused
    (tmp_path / "really.gif").write_bytes((tmp_path / "p.png").read_bytes())
    assert image_problem(tmp_path / "really.gif") is None
    truncated = tmp_path / "cut.png"
    truncated.write_bytes((tmp_path / "p.png").read_bytes()[:60])
    assert "does not decode" in image_problem(truncated)
    huge = tmp_path / "huge.png"
    with open(huge, "wb") as out:
        out.truncate(MAX_IMAGE_BYTES + (1 << 20))
    assert "at most 50 MiB" in image_problem(huge)


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path: Path):
    """A 40,000 x 40,000 PNG of a few hundred bytes: refused before any pixel is decoded."""
    raw = io.BytesIO()
    Image.new("1", (1, 1)).save(raw, "PNG")
    data = bytearray(raw.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", 40000, 40000)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(bytes(data))
    problem = image_problem(bomb)
    assert problem is not None and ("40000x40000" in problem or "bomb" in problem), problem


def test_every_colour_form_becomes_8_bit_rgb(tmp_path: Path):
    # transparency over black
    rgba = Image.new("RGBA", (8, 8), (255, 255, 255, 0))
    rgba.putpixel((0, 0), (0, 255, 0, 255))
    frame = load_image(save(tmp_path / "a.png", rgba, "PNG"), 8, 8, "crop")
    assert tuple(frame[0, 0]) == (0, 255, 0) and tuple(frame[4, 4]) == (0, 0, 0)
    # a palette picture
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 10, 20, 250] + [0] * 762)
    assert tuple(load_image(save(tmp_path / "p.png", palette, "PNG"), 8, 8, "crop")[3, 3]) == (
        10, 20, 250
    )  # fmt: skip
    # CMYK JPEG, 16-bit grey
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # red in CMYK
    r, g, b = load_image(save(tmp_path / "c.jpg", cmyk, "JPEG", quality=95), 8, 8, "crop")[4, 4]
    assert r > 200 and g < 60 and b < 60
    grey = Image.fromarray(np.full((8, 8), 32768, np.uint16))
    value = load_image(save(tmp_path / "g.png", grey, "PNG"), 8, 8, "crop")[4, 4]
    assert all(abs(int(v) - 128) <= 1 for v in value), value
    # EXIF orientation: a picture stored sideways with "rotate 90" comes out upright
    tall = Image.new("RGB", (8, 16), (0, 0, 0))
    tall.paste((255, 0, 0), (0, 0, 8, 4))  # red on top
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    stored = tall.transpose(Image.Transpose.ROTATE_90)
    upright = load_image(save(tmp_path / "o.jpg", stored, "JPEG", exif=exif, quality=95),
                         8, 16, "crop")  # fmt: skip
    assert upright[:3, :, 0].min() > 200 and upright[-3:, :, 0].max() < 60  # red on top


def test_pad_fits_inside_with_black_bars_and_crop_covers(tmp_path: Path):
    wide = save(tmp_path / "w.png", Image.new("RGB", (200, 100), (200, 10, 10)), "PNG")
    padded = load_image(wide, 64, 64, "pad")
    assert padded.shape == (64, 64, 3)
    assert padded[:14].max() == 0 and padded[-14:].max() == 0  # bars above and below
    assert tuple(padded[32, 32]) == (200, 10, 10)
    cropped = load_image(wide, 64, 64, "crop")
    assert (cropped.reshape(-1, 3) == (200, 10, 10)).all()
    with pytest.raises(ValueError, match="pad, crop"):
        load_image(wide, 64, 64, "stretch")
