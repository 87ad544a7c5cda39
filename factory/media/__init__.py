"""Every ffmpeg invocation of the factory: argv built by pure functions, run in one place.

The ffmpeg binary is the one shipped by the `imageio-ffmpeg` wheel (a static 9.0 build
with libx265, libx264 and libvmaf), so a plain `pip install` gives every machine the same
encoder versions without apt. It has no ffprobe; probing uses PyAV (`factory.media.probe`).
Beside them, the pictures themselves: frames read by index (`frames`), the lossless segment
intermediate (`intermediate`) and the seams' frame maths (`stitch`, numpy alone).
"""
