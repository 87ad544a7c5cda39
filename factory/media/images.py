"""Pictures a manifest brings (a scene's first frame or reference image): checked before a
batch is accepted, and decoded to the video's frame size by one rule.

- Formats: PNG, JPEG, WebP. Anything else, or a file that does not decode, is refused.
- Size: at most MAX_IMAGE_BYTES on disk and MAX_IMAGE_PIXELS pixels, read from the header
  before any pixel is decoded (a small file that claims a huge picture, a decompression
  bomb, is refused without being expanded).
- Colour: EXIF orientation applied; palette, grey, CMYK and 16-bit pictures converted to
  8-bit RGB; an embedded ICC profile converted to sRGB; transparency composited over black.
- Size rule (`image_fit`): `pad` scales the picture to fit inside the frame and centres it
  on black bars; `crop` scales it to cover the frame and cuts the overflow equally from
  both sides. Lanczos filtering either way.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageCms, ImageOps

from factory.media.identify import NotMedia, identify

MAX_IMAGE_BYTES = 50 << 20
MAX_IMAGE_PIXELS = 40_000_000  # 40 MP: a 7680x5120 still, never a decompression bomb
FITS = ("pad", "crop")
BAND_ROWS = 256  # rows converted at a time from 16-bit


class ImageProblem(ValueError):
    """Why a picture cannot be used: its text completes "IMAGE ..."."""


def image_problem(path: Path) -> str | None:
    """Why a picture cannot be used (wrong format, too large, a decompression bomb, does
    not decode), or None when it can; it is decoded in full to find out (its EXIF read too),
    and not converted: what follows decoding cannot fail, and a copy of 40 MP would double
    the check's memory."""
    try:
        picture = _decoded(path)
        picture.getexif()
    except ImageProblem as exc:
        return str(exc)
    except (OSError, ValueError, SyntaxError) as exc:
        return f"does not decode as a picture (its EXIF: {str(exc)[:200]})"
    return None


def load_image(path: Path, width: int, height: int, fit: str) -> np.ndarray:
    """The picture as an RGB uint8 frame of width x height, by the `fit` rule."""
    if fit not in FITS:
        raise ValueError(f"image_fit {fit!r}: one of {', '.join(FITS)}")
    picture = _as_rgb(_decoded(path))
    if fit == "crop":
        framed = ImageOps.fit(picture, (width, height), Image.Resampling.LANCZOS)
    else:
        framed = ImageOps.pad(picture, (width, height), Image.Resampling.LANCZOS, color=(0, 0, 0))
    return np.ascontiguousarray(np.asarray(framed.convert("RGB"), np.uint8))


def _decoded(path: Path) -> Image.Image:
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ImageProblem(f"is {size >> 20} MiB; at most {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        container = identify(path, "picture")
    except NotMedia as exc:
        raise ImageProblem(str(exc)) from None
    data = path.read_bytes()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            header = Image.open(io.BytesIO(data), formats=[container.demuxer])
            width, height = header.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageProblem(
                    f"is {width}x{height} ({width * height / 1e6:.0f} MP); at most "
                    f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP"
                )
            frames = getattr(header, "n_frames", 1)
            if frames > 1:
                raise ImageProblem(f"is animated ({frames} frames); a picture here is a still")
            header.load()
    except ImageProblem:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageProblem(f"is a decompression bomb ({exc})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageProblem(f"does not decode as a picture ({str(exc)[:200]})") from None
    return header


def _as_rgb(picture: Image.Image) -> Image.Image:
    picture = ImageOps.exif_transpose(picture) or picture
    profile = picture.info.get("icc_profile")
    if profile and picture.mode in ("RGB", "RGBA", "CMYK"):
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(profile))
            mode = "RGBA" if picture.mode == "RGBA" else "RGB"
            picture = (
                ImageCms.profileToProfile(
                    picture, source, ImageCms.createProfile("sRGB"), outputMode=mode
                )
                or picture
            )
        except (ImageCms.PyCMSError, OSError):
            pass  # an unreadable profile: the pixels as they are
    if picture.mode in ("I;16", "I;16B", "I;16L", "I"):
        picture = _eight_bit(picture)
    if picture.mode == "P":
        picture = picture.convert("RGBA")
    if picture.mode in ("RGBA", "LA", "PA"):
        rgba = picture.convert("RGBA")
        black = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        picture = Image.alpha_composite(black, rgba)
    return picture.convert("RGB")


def _eight_bit(picture: Image.Image) -> Image.Image:
    """A 16- or 32-bit grey picture as 8-bit grey: scaled from 0-65535 (0-255 where no value
    is over 255), rounded, a band of rows at a time in integers (a 40 MP picture as one
    float64 array was 320 MB, with its copies over 1 GiB)."""
    wide = np.asarray(picture)
    top = 65535 if int(wide.max()) > 255 else 255
    out = np.empty(wide.shape, np.uint8)
    for row in range(0, wide.shape[0], BAND_ROWS):
        band = np.clip(wide[row : row + BAND_ROWS].astype(np.int64), 0, top)
        out[row : row + BAND_ROWS] = (band * 255 * 2 + top) // (2 * top)
    return Image.fromarray(out)
