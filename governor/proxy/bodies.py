"""Compressed bodies, undone a slice at a time under a size limit and a ratio limit.

mitmproxy's `message.content` inflates a body whole before anyone can look at its size:
a 509 KiB gzip body became half a GiB in memory. Here every Content-Encoding the agent
or an upstream can name (gzip, x-gzip, deflate, br, zstd, and chains of them, e.g.
"gzip, br") is decoded incrementally: the input is fed in small slices and each call may
return only a bounded amount of output (zlib's `max_length`, brotli's
`output_buffer_limit`, zstd's `max_length`), so the work stops as soon as the decoded
size passes `limit` or the decoded/compressed ratio passes `ratio` (past `ratio_floor`
bytes: small bodies compress as they like). Peak memory is then about what was decoded
before the stop, not what the bomb would have become.

An encoding the governor cannot undo is refused (415), never passed on unread: a
server that knows it would read a body the governor could not.
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import brotli

if sys.version_info >= (3, 14):  # as mitmproxy imports it
    from compression import zstd
else:  # pragma: no cover
    from backports import zstd

IN_SLICE = 16 * 1024  # compressed bytes fed per call: the ratio is judged on what was fed
OUT_STEP = 256 * 1024  # decoded bytes one call may return

DEFAULT_RATIO = 200.0  # gzip'd JSON decodes to 5-30x; a bomb to ~1000x (gzip), far more (br, zstd)
DEFAULT_RATIO_FLOOR = 1024 * 1024  # decoded sizes up to this are never judged by their ratio


class BodyError(Exception):
    """A body that cannot be read within the bounds: `status` says why (413 too large,
    415 an unknown encoding, 400 corrupt), `message` says it for humans."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Bounds:
    limit: int  # decoded bytes
    ratio: float = DEFAULT_RATIO
    ratio_floor: int = DEFAULT_RATIO_FLOOR


def encodings(fields: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """The Content-Encoding codings of raw header fields, in the order they were applied
    (every field, comma lists split, lower case; identity dropped)."""
    found: list[str] = []
    for name, value in fields:
        if name.lower() == b"content-encoding":
            for coding in value.decode("latin-1").split(","):
                coding = coding.strip().lower()
                if coding and coding != "identity":
                    found.append(coding)
    return found


def decode(body: bytes, codings: Sequence[str], bounds: Bounds) -> bytes:
    """`body` with `codings` undone (last applied, first undone), within `bounds`.
    Raises BodyError."""
    compressed = len(body)
    if not compressed:
        return body
    for coding in reversed(codings):
        pieces = _DECODERS.get(coding)
        if pieces is None:
            raise BodyError(f"content-encoding {coding!r} cannot be decoded by the governor "
                            f"(it reads gzip, deflate, br and zstd)", 415)
        out: list[bytes] = []
        size = 0
        try:
            for piece, fed in pieces(body):
                size += len(piece)
                out.append(piece)
                if size > bounds.limit:
                    raise BodyError(f"body decodes ({coding}) to more than the governor's limit of "
                                    f"{bounds.limit} bytes", 413)
                # judged on what was fed so far (a bomb is caught early) and, through a chain
                # of codings, on the body as it came
                if size > bounds.ratio_floor and size > bounds.ratio * min(fed, compressed):
                    raise BodyError(f"body decodes ({coding}) to more than {bounds.ratio:g} times its "
                                    f"compressed size of {compressed} bytes (a decompression bomb?)", 413)
        except BodyError:
            raise
        except (zlib.error, brotli.error, zstd.ZstdError, EOFError, ValueError) as exc:
            raise BodyError(f"body cannot be decoded ({coding}): {exc}", 400) from None
        body = b"".join(out)
        del out
    return body


# --- one decoder per coding: each yields (decoded piece, compressed bytes fed so far) -------


def _zlib(body: bytes, wbits: int) -> Iterator[tuple[bytes, int]]:
    """gzip members back to back (as gzip.decompress reads them), or one zlib/raw stream."""
    view = memoryview(body)
    pos = 0  # the next compressed byte not yet fed
    while True:
        decoder = zlib.decompressobj(wbits)
        while not decoder.eof:
            if decoder.unconsumed_tail:
                piece = decoder.decompress(decoder.unconsumed_tail, OUT_STEP)
            elif pos < len(body):
                data = view[pos:pos + IN_SLICE]
                pos += len(data)
                piece = decoder.decompress(data, OUT_STEP)
            else:  # all fed: what the decoder still holds (at most a window), then the end
                piece = decoder.decompress(b"", OUT_STEP) or decoder.flush()
                if not piece and not decoder.eof:
                    raise zlib.error("truncated stream")
            if piece:
                yield piece, pos
        start = pos - len(decoder.unused_data)
        if wbits == 47 and body[start:start + 2] == b"\x1f\x8b":
            pos = start  # another gzip member
            continue
        if body[start:].strip(b"\x00"):
            raise zlib.error("data after the end of the compressed stream")
        return


def _gzip(body: bytes) -> Iterator[tuple[bytes, int]]:
    return _zlib(body, 47)  # 32 + 15: gzip or zlib, detected (as mitmproxy decodes "gzip")


def _deflate(body: bytes) -> Iterator[tuple[bytes, int]]:
    # "deflate" is zlib-wrapped by the standard and raw in some clients: tell them apart by
    # the zlib header (CM = 8, header checksum) as mitmproxy's fallback does by trying
    zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
    return _zlib(body, 15 if zlib_header else -15)


def _brotli(body: bytes) -> Iterator[tuple[bytes, int]]:
    decoder = brotli.Decompressor()
    fed = 0
    while fed < len(body):
        chunk = body[fed:fed + IN_SLICE]
        fed += len(chunk)
        piece = decoder.process(chunk, output_buffer_limit=OUT_STEP)
        if piece:
            yield piece, fed
        while not decoder.can_accept_more_data():
            piece = decoder.process(b"", output_buffer_limit=OUT_STEP)
            if piece:
                yield piece, fed
            elif not decoder.can_accept_more_data():
                break
        if decoder.is_finished() and fed < len(body):
            raise brotli.error("data after the end of the compressed stream")
    if not decoder.is_finished():
        raise brotli.error("truncated stream")


def _zstd(body: bytes) -> Iterator[tuple[bytes, int]]:
    """zstd frames back to back (as zstd.decompress reads them)."""
    view = memoryview(body)
    fed = 0
    while True:
        decoder = zstd.ZstdDecompressor()
        while not decoder.eof:
            if decoder.needs_input:
                if fed >= len(body):
                    raise zstd.ZstdError("truncated stream")
                chunk = view[fed:fed + IN_SLICE]
                fed += len(chunk)
            else:
                chunk = b""
            piece = decoder.decompress(chunk, OUT_STEP)
            if piece:
                yield piece, fed
        fed -= len(decoder.unused_data)
        if fed >= len(body):
            return


_DECODERS: dict[str, Callable[[bytes], Iterator[tuple[bytes, int]]]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}

__all__ = ["BodyError", "Bounds", "decode", "encodings", "DEFAULT_RATIO", "DEFAULT_RATIO_FLOOR"]
