"""Content codings: compressed request bodies inflated as they arrive, and gzip/deflate responses.

A request's `Content-Encoding: gzip` or `deflate` body is fed to a streaming decompressor chunk by chunk as the
socket delivers it, each call bounded by `max_length`, so the body limit (`--max_body_bytes`) applies to the
*decompressed* size and a decompression bomb is refused (413) as soon as its output passes the limit, having
held at most that much. Any other coding is 415, naming it. A response is compressed when the client's
`Accept-Encoding` takes gzip (or deflate) and its body is over `--response_compression_min_bytes`; on /v2, only
an inference answer is, as Triton does (`compressible`).
"""

from __future__ import annotations

import zlib

from serving.http.messages import Rejected

PIECE_BYTES = (
    256 << 10
)  # decompressed output per call: a bomb's output is made and checked this much at a time
GZIP_WBITS, ZLIB_WBITS, RAW_WBITS = 31, 15, -15
RESPONSE_LEVEL = (
    1  # zlib level of responses: 1 is the cheapest per byte saved (docs/perf/serving-compression.md)
)
_IDENTITY = ("", "identity")


class BodyInflater:
    """Inflates one request body of `coding` ("gzip" or "deflate"); `feed` returns the decompressed pieces.

    `deflate` is the zlib format (RFC 9110), as tritonclient sends it; a raw deflate stream is taken too.
    Concatenated gzip members are one body (RFC 1952).
    """

    def __init__(self, coding: str, limit: int) -> None:
        """`limit`: the most decompressed bytes the body may have (--max_body_bytes); over it: 413."""
        self.coding, self.limit, self.size = coding, limit, 0
        self._inflater: zlib._Decompress | None = zlib.decompressobj(GZIP_WBITS) if coding == "gzip" else None
        self._head = b""  # deflate: the first bytes, until the zlib header can be told from a raw stream
        self._fed = False

    def feed(self, data: bytes) -> list[bytes]:
        """The decompressed bytes of the next compressed chunk; Rejected 413 over the limit, 400 if corrupt."""
        self._fed = True
        if self._inflater is None:  # deflate: zlib (2-byte header, a multiple of 31) or raw?
            self._head += data
            if len(self._head) < 2:
                return []
            data, self._head = self._head, b""
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._inflater = zlib.decompressobj(ZLIB_WBITS if zlib_header else RAW_WBITS)
        pieces: list[bytes] = []
        while True:
            if self._inflater.eof:  # a gzip member ended: another may follow
                data = self._inflater.unused_data + data
                if not data:
                    return pieces
                data = self._next_member(data)
            cap = min(PIECE_BYTES, self.limit - self.size + 1)
            try:
                piece = self._inflater.decompress(data, cap)
            except zlib.error as exc:
                raise Rejected(400, self._corrupt(str(exc)), "") from None
            self.size += len(piece)
            if self.size > self.limit:
                raise Rejected(
                    413,
                    f"request body decompresses to over the limit of {self.limit} bytes (--max_body_bytes); "
                    "send a smaller batch",
                    "body_bytes",
                )
            if piece:
                pieces.append(piece)
            data = self._inflater.unconsumed_tail
            if not data and len(piece) < cap and not self._inflater.eof:
                return pieces  # all input taken and no output held back: wait for the next chunk

    def _next_member(self, data: bytes) -> bytes:
        if self.coding != "gzip":
            raise Rejected(400, self._corrupt(f"{len(data)} bytes after the end of the stream"), "")
        self._inflater = zlib.decompressobj(GZIP_WBITS)
        return data

    def finish(self) -> None:
        """The body ended: Rejected 400 unless the compressed stream ended too (an empty body is fine)."""
        if self._fed and (self._inflater is None or not self._inflater.eof):
            raise Rejected(400, self._corrupt("the stream is truncated"), "")

    def _corrupt(self, detail: str) -> str:
        return (
            f"request body is not valid {self.coding} (Content-Encoding: {self.coding}): {detail}; "
            f"send it {self.coding}-compressed, or without Content-Encoding"
        )


def request_coding(value: bytes) -> str | None:
    """The coding of a `Content-Encoding` value: "gzip", "deflate" or None (identity); Rejected 415 otherwise."""
    coding = value.decode("latin-1").strip().lower()
    if coding in _IDENTITY:
        return None
    if coding in ("gzip", "x-gzip"):
        return "gzip"
    if coding == "deflate":
        return "deflate"
    raise Rejected(
        415,
        f"Content-Encoding '{coding[:64]}' is not supported; send the body as gzip, deflate or uncompressed",
        "",
    )


def response_coding(accept: bytes) -> str | None:
    """The coding to answer with, from an `Accept-Encoding` value: "gzip", "deflate" or None.

    gzip when the client takes it (also through `*`), else deflate; a `q=0` coding is refused by the client.
    """
    taken: set[str] = set()
    for item in accept.decode("latin-1").lower().split(","):
        coding, _, params = item.partition(";")
        q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            if float(q) <= 0:
                continue
        except ValueError:
            continue
        taken.add(coding.strip())
    if "gzip" in taken or "x-gzip" in taken or "*" in taken:
        return "gzip"
    return "deflate" if "deflate" in taken else None


def compressible(path: str) -> bool:
    """Whether the answer to `path` may be compressed: any but a v2 answer other than an inference.

    Triton compresses only inference responses, and tritonclient's aio HTTP client relies on it: aiohttp offers
    `Accept-Encoding: gzip, deflate` on every request, but the client inflates only what `infer` gets back, so
    a compressed model metadata, config, statistics or repository index answer fails its JSON parse.
    """
    return not path.startswith("/v2") or path.endswith("/infer")


def compress(body: bytes, coding: str) -> bytes:
    """`body` as `coding` ("gzip" or "deflate", the zlib format) at RESPONSE_LEVEL."""
    packer = zlib.compressobj(RESPONSE_LEVEL, zlib.DEFLATED, GZIP_WBITS if coding == "gzip" else ZLIB_WBITS)
    return packer.compress(body) + packer.flush()
