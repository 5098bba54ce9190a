"""What an OpenAI image or audio call is charged for: the figures the media adapter reserves
before the call and settles from its answer (governor.adapters.openai_media).

Two shapes, by model: token-billed models (gpt-image-*, gpt-4o-mini-tts, gpt-4o-transcribe)
are reserved and charged in tokens, from the answer's `usage` when it has one; the others
(DALL-E, tts-1, whisper-1, and any model the governor does not know) in units the pricing
table prices per piece (governor.policy.pricing): `image/<size>/<quality>` per image,
`character` per character spoken, `audio_second` per second of audio. A unit a model's
price lacks makes the call unpriced: refused under a cost cap, with a message naming it.

The bounds here are documented in docs/reference/pricing.md.
"""

from __future__ import annotations

import math
import re

# gpt-image-1 output tokens per image, by size and quality (OpenAI's image generation guide,
# "Cost and latency"). gpt-image-1-mini and gpt-image-1.5 are taken to use the same counts;
# their answers carry `usage`, which settles the call either way.
IMAGE_TOKENS: dict[str, dict[str, int]] = {
    "1024x1024": {"low": 272, "medium": 1056, "high": 4160},
    "1024x1536": {"low": 408, "medium": 1584, "high": 6240},
    "1536x1024": {"low": 400, "medium": 1568, "high": 6208},
}
LARGEST_IMAGE_TOKENS = 6240  # `size: auto`: the largest of the table
PARTIAL_IMAGE_TOKENS = 100  # each streamed partial image adds 100 output tokens (same guide)
# An input image of an edit, reserved as this many input tokens (high input fidelity of a
# 1536-pixel image is below it); the answer's usage settles the call.
INPUT_IMAGE_TOKENS = 6500
_SIZE = re.compile(r"^(\d{2,5})x(\d{2,5})$")

# Speech from a token-billed model (gpt-4o-mini-tts): about 1,250 audio tokens a minute
# (OpenAI's estimate, $0.015 a minute at $12 per million) and about 15 characters a second
# of speech, i.e. 1.4 tokens per character at speed 1: reserved at 2, divided by the speed
# when it slows the speech down.
SPEECH_TOKENS_PER_CHARACTER = 2.0

# Audio the governor cannot decode is reserved by its size: at most this many bytes per
# second of audio are assumed, below the lowest bitrate of the encoders of the formats the
# API takes (4 kbit/s; MP3's least is 8, Opus's 6, HE-AAC v2's about 5), so the seconds
# reserved are at least the real ones. Settled by the answer's `usage` (seconds or tokens)
# when it has one, else charged as reserved. Configurable: `audio_bytes_per_second` in the
# config file (governor/cli/run.py puts it in AdapterConfig.extra).
AUDIO_BYTES_PER_SECOND = 500
# Input tokens a second of audio is reserved as, for a token-billed transcription model
# (gpt-4o-transcribe: about $0.006 a minute at $6 per million, i.e. 17 a second).
AUDIO_TOKENS_PER_SECOND = 20


def token_billed_image(model: str) -> bool:
    name = model.lower().rsplit("/", 1)[-1]
    return name.startswith(("gpt-image", "chatgpt-image"))


def token_billed_speech(model: str) -> bool:
    return model.lower().rsplit("/", 1)[-1].startswith("gpt-")


def token_billed_transcription(model: str) -> bool:
    return "transcribe" in model.lower()


def image_unit(model: str, size: str | None, quality: str | None) -> str:
    """The pricing unit of one image from a per-image model (DALL-E): `image/<size>/<quality>`,
    the API's defaults filled in (1024x1024, standard; `auto` quality as the dearer `hd` for
    dall-e-3, the only `standard` for dall-e-2)."""
    size = (size or "1024x1024").strip().lower()
    quality = (quality or "standard").strip().lower()
    if quality == "auto":
        quality = "standard" if model.lower().startswith("dall-e-2") else "hd"
    return f"image/{size}/{quality}"


def image_output_tokens(size: str | None, quality: str | None, *, floor: bool = False) -> int:
    """Output tokens of one image of a token-billed model. Reserving (floor False): `auto`
    or an unknown quality as `high`, `auto` size as the largest, another size scaled by its
    pixels from the largest. Measuring an answer (floor True): the least the size can cost
    (`low`) unless the quality is known."""
    size = (size or "auto").strip().lower()
    quality = (quality or "auto").strip().lower()
    table = IMAGE_TOKENS.get(size)
    if table is None:
        match = _SIZE.match(size)
        if match is None:  # auto, or a size the governor does not know
            return IMAGE_TOKENS["1024x1024"]["low"] if floor else LARGEST_IMAGE_TOKENS
        pixels = int(match.group(1)) * int(match.group(2))
        scale = pixels / (1024 * 1536)
        table = {key: math.ceil(value * scale) for key, value in IMAGE_TOKENS["1024x1536"].items()}
    if quality in table:
        return table[quality]
    return table["low"] if floor else table["high"]


def audio_seconds(size: int, bytes_per_second: float) -> int:
    """Seconds of audio a file of `size` bytes is reserved as (at least 1)."""
    return max(1, math.ceil(size / bytes_per_second))


def speech_output_tokens(characters: int, speed: float | None) -> int:
    slower = min(speed, 1.0) if speed and speed > 0 else 1.0
    return math.ceil(characters * SPEECH_TOKENS_PER_CHARACTER / slower)


__all__ = ["IMAGE_TOKENS", "PARTIAL_IMAGE_TOKENS", "INPUT_IMAGE_TOKENS", "AUDIO_BYTES_PER_SECOND",
           "AUDIO_TOKENS_PER_SECOND", "SPEECH_TOKENS_PER_CHARACTER", "token_billed_image", "token_billed_speech",
           "token_billed_transcription", "image_unit", "image_output_tokens", "audio_seconds", "speech_output_tokens"]
