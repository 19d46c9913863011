"""Per-frame cost of the TCP frames' integrity (issue 19): sign + verify, in µs per frame.

    python benchmarks/bench_frame_mac.py [--quick] [--repeat N]

Times, with :mod:`timeit` (best of ``--repeat``), one frame sealed by one end and opened
(verified) by the other, for the frames a run sends (``A``/``P`` 1 byte, ``R`` 17, a 3-D
``B`` 121, an ``F`` with an 8 KiB traceback):

* ``daisy_nb`` — :class:`daisy_nb.runtime.net.frames.FrameCodec` as shipped: keyed BLAKE2b,
  an 8-byte tag over (sequence, length) and a 16-byte tag over (sequence, length, payload),
  keyed states copied per frame;
* ``plain`` — the protocol before issue 19 (``u32`` length + payload, no MAC), the floor;
* ``hmac-sha256`` — the same two tags as truncated HMAC-SHA256 (``hmac.digest``, OpenSSL's
  one-shot path), the other standard-library candidate;
* ``blake2b-keyed`` — BLAKE2b keyed anew for every tag (no state copy).

The choice in ``daisy_nb.runtime.net.frames`` is the cheapest of the MACs here. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import struct
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from daisy_nb.runtime.net import frames as net_frames  # noqa: E402

PAYLOADS = {
    "A/P (1 B)": b"A",
    "R (17 B)": b"R" + struct.pack("<qq", 123, 2),
    "B 3-D (121 B)": b"B" + struct.pack("<qqq", 5, 5, 3) + struct.pack("<12q", *range(12)),
    "F (8 KiB)": b"F" + struct.pack("<q", 5) + b"x" * 8192,
}
_LEN = struct.Struct("<I")
_SL = struct.Struct("<QI")


class Plain:
    """Before issue 19: length + payload."""

    def seal(self, p: bytes) -> bytes:
        return _LEN.pack(len(p)) + p

    def open(self, buf: bytearray) -> list[bytes]:
        out = []
        while len(buf) >= 4:
            (n,) = _LEN.unpack_from(buf)
            if len(buf) < 4 + n:
                break
            out.append(bytes(buf[4 : 4 + n]))
            del buf[: 4 + n]
        return out


class TwoTags:
    """The shipped layout (length | htag 8 | payload | tag 16) with another MAC function."""

    def __init__(self, key: bytes, mac):
        self.key, self.mac, self.s, self.r = key, mac, 0, 0

    def seal(self, p: bytes) -> bytes:
        sl = _SL.pack(self.s, len(p))
        self.s += 1
        return sl[8:] + self.mac(self.key, b"h" + sl, 8) + p + self.mac(self.key, b"f" + sl + p, 16)

    def open(self, buf: bytearray) -> list[bytes]:
        out = []
        while len(buf) >= 12:
            (n,) = _LEN.unpack_from(buf)
            sl = _SL.pack(self.r, n)
            if not hmac.compare_digest(bytes(buf[4:12]), self.mac(self.key, b"h" + sl, 8)):
                raise ValueError("header")
            if len(buf) < 12 + n + 16:
                break
            p = bytes(buf[12 : 12 + n])
            if not hmac.compare_digest(bytes(buf[12 + n : 28 + n]), self.mac(self.key, b"f" + sl + p, 16)):
                raise ValueError("tag")
            out.append(p)
            self.r += 1
            del buf[: 28 + n]
        return out


def _hmac_sha256(key, msg, size):
    return hmac.digest(key, msg, "sha256")[:size]


def _blake2b_keyed(key, msg, size):
    return hashlib.blake2b(msg, key=key, digest_size=size).digest()


def codecs():
    key, ns, nc = os.urandom(32), os.urandom(16), os.urandom(16)
    return {
        "daisy_nb": lambda: (net_frames.FrameCodec.client(key, ns, nc), net_frames.FrameCodec.server(key, ns, nc)),
        "plain": lambda: (Plain(), Plain()),
        "hmac-sha256": lambda: (TwoTags(key, _hmac_sha256), TwoTags(key, _hmac_sha256)),
        "blake2b-keyed": lambda: (TwoTags(key, _blake2b_keyed), TwoTags(key, _blake2b_keyed)),
    }


def per_frame_us(make, payload: bytes, number: int, repeat: int) -> float:
    tx, rx = make()
    buf = bytearray()

    def one():
        buf.extend(tx.seal(payload))
        (got,) = rx.open(buf)
        assert got == payload

    return min(timeit.repeat(one, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few thousand frames (smoke run)")
    ap.add_argument("--repeat", type=int, default=None, help="timeit repeats, best taken (default 7; 2 with --quick)")
    a = ap.parse_args()
    number = 2_000 if a.quick else 50_000
    repeat = a.repeat or (2 if a.quick else 7)
    made = codecs()
    print(f"sign + verify, µs per frame (best of {repeat} x {number:,}); load {os.getloadavg()[0]:.1f}\n")
    print("| frame | " + " | ".join(made) + " | daisy_nb - plain |")
    print("|---|" + "---:|" * (len(made) + 1))
    for name, payload in PAYLOADS.items():
        us = {k: per_frame_us(m, payload, number, repeat) for k, m in made.items()}
        cells = " | ".join(f"{v:.2f}" for v in us.values())
        print(f"| {name} | {cells} | {us['daisy_nb'] - us['plain']:+.2f} |")


if __name__ == "__main__":
    main()
