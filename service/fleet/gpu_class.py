"""A GPU's class: the model and memory a scheduler asks for, e.g. H100-80GB.

Derived from what the driver reports, by a fixed rule so every service process
and every release names the same card the same way:

1. Vendor and family words are dropped (NVIDIA, Tesla, GeForce, Quadro), and so
   are memory types (HBM3, GDDR6...) and form factors (SXM4, PCIe...).
2. The model is the first word left, upper-cased, letters and digits only;
   RTX/GTX join the word after them ("RTX 4090" -> RTX4090). Nothing left
   gives UNKNOWN.
3. The memory is the marketed size: the driver reports less than the card's
   label (ECC and firmware reserve some), so the measured MiB are rounded up to
   the nearest size cards are sold in (46068 MiB on an L40S is 48 GB). With no
   measured memory, a size written in the name ("A100-SXM4-40GB") is used.
4. Class = MODEL-<size>GB, or just MODEL when no size is known.
"""

from __future__ import annotations

import functools
import math
import re

_DROPPED = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO", "GRID", "DATA", "CENTER"}
_FORM_FACTOR = re.compile(r"^(SXM\d*|PCIE|HGX|DGX|MIG|NVL\d*|OEM|MAX-?Q)$")
_MEMORY_TYPE = re.compile(r"^(HBM\d*E?|GDDR\d*X?|LPDDR\d*X?)$")
_NAMED_SIZE = re.compile(r"^(\d+)GB$")
_JOINS_NEXT = {"RTX", "GTX"}

# Sizes GPUs are sold with, in GB. The reported capacity is always a little
# under the label, so the class takes the smallest of these that holds it.
MARKETED_SIZES_GB = (
    1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96,
    120, 128, 141, 144, 180, 192, 256, 268, 288,
)  # fmt: skip

# Slack for a card that reports a hair over its label (40960 MiB is exactly
# 40 GiB on an A100-40GB; rounding noise must not make it a 48 GB class).
_TOLERANCE_GIB = 0.05


def marketed_size_gb(memory_mb: int) -> int:
    gib = memory_mb / 1024
    for size in MARKETED_SIZES_GB:
        if gib <= size + _TOLERANCE_GIB:
            return size
    return math.ceil(gib)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[\s\-_/]+", name.upper()) if w]


# Made once per (name, memory): a report derives it for each of its GPUs, and
# every re-registration would run the regular expressions again.
@functools.lru_cache(maxsize=1024)
def derive_gpu_class(name: str, memory_mb: int | None) -> str:
    words = _words(name)
    named_size: int | None = None
    model_words: list[str] = []
    for word in words:
        match = _NAMED_SIZE.match(word)
        if match:
            named_size = named_size or int(match.group(1))
            continue
        if word in _DROPPED or _FORM_FACTOR.match(word) or _MEMORY_TYPE.match(word):
            continue
        model_words.append(word)

    if not model_words:
        model = "UNKNOWN"
    elif model_words[0] in _JOINS_NEXT and len(model_words) > 1:
        model = model_words[0] + model_words[1]
    else:
        model = model_words[0]
    model = re.sub(r"[^A-Z0-9]", "", model) or "UNKNOWN"

    if memory_mb is not None and memory_mb > 0:
        return f"{model}-{marketed_size_gb(memory_mb)}GB"
    if named_size is not None:
        return f"{model}-{named_size}GB"
    return model
