# SPDX-License-Identifier: MIT
"""A vLLM KV cache tensor's shape and strides -> the broker's KV geometry.

vLLM hands the connector one tensor per attention layer whose *logical*
shape is the attention backend's: ``[2, num_blocks, block_size, heads,
head_dim]`` (FlashAttention, ROCm) or ``[num_blocks, 2, block_size, heads,
head_dim]`` (FlashInfer). The *physical* order is in the strides: the
backend's stride order, and the HND layout (heads before tokens inside a
block), permute the memory while the shape stays the same. The broker knows
two dense layouts, K/V outermost (KV_FIRST) or blocks outermost
(BLOCK_FIRST), each block ``[block_size, heads, head_dim]``. An HND block
``[heads, block_size, head_dim]`` has the same size and moves whole as well;
only splitting a block's heads across TP ranks needs NHD, so an HND layer is
refused for transfers whose two sides hold different heads.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_FIRST = 0  # KVB_KV_KV_FIRST
BLOCK_FIRST = 1  # KVB_KV_BLOCK_FIRST
_U32 = 1 << 32


class LayoutError(ValueError):
    """The tensor is laid out in a way the broker's geometry cannot say."""


@dataclass(frozen=True)
class LayerLayout:
    layout: int  # KV_FIRST or BLOCK_FIRST
    num_blocks: int
    block_size: int
    num_heads: int
    head_dim: int
    elem_size: int
    hnd: bool  # heads before tokens inside a block

    @property
    def nbytes(self) -> int:
        return (2 * self.num_blocks * self.block_size * self.num_heads *
                self.head_dim * self.elem_size)

    @property
    def name(self) -> str:
        return "%s/%s" % ("KV_FIRST" if self.layout == KV_FIRST else
                          "BLOCK_FIRST", "HND" if self.hnd else "NHD")


def _expected_strides(sizes: dict, outer: tuple, inner: tuple) -> dict:
    """Dense strides (in elements) for the physical order outer + inner +
    ('dim',)."""
    order = outer + inner + ("dim",)
    strides, step = {}, 1
    for name in reversed(order):
        strides[name] = step
        step *= sizes[name]
    return strides


def derive(shape, strides, elem_size: int, what: str = "tensor") -> LayerLayout:
    """The geometry of one layer's KV tensor, or LayoutError saying why not.

    shape and strides are in elements (torch's .shape and .stride()).
    """
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if len(shape) != 5:
        raise LayoutError(
            "%s: shape %s: the broker needs [2, num_blocks, block_size, "
            "heads, head_dim] or [num_blocks, 2, block_size, heads, "
            "head_dim]; MLA latent caches (3 dims) and cross-layer KV "
            "blocks (6 dims) are not supported" % (what, list(shape)))
    if shape[0] == 2:
        names = ("kv", "blk", "tok", "head", "dim")
    elif shape[1] == 2:
        names = ("blk", "kv", "tok", "head", "dim")
    else:
        raise LayoutError(
            "%s: shape %s has no K/V dimension of size 2 first or second"
            % (what, list(shape)))
    sizes = dict(zip(names, shape))
    got = dict(zip(names, strides))
    if min(shape) < 1 or elem_size not in (1, 2, 4, 8):
        raise LayoutError("%s: shape %s, element size %d: unsupported" %
                          (what, list(shape), elem_size))
    for name in ("blk", "tok", "head", "dim"):
        if sizes[name] >= _U32:
            raise LayoutError("%s: %s = %d does not fit 32 bits" %
                              (what, name, sizes[name]))
    for outer, layout in ((("kv", "blk"), KV_FIRST),
                          (("blk", "kv"), BLOCK_FIRST)):
        for inner, hnd in ((("tok", "head"), False), (("head", "tok"), True)):
            want = _expected_strides(sizes, outer, inner)
            # a dimension of size 1 may carry any stride
            if all(sizes[n] == 1 or got[n] == want[n] for n in names):
                return LayerLayout(layout, sizes["blk"], sizes["tok"],
                                   sizes["head"], sizes["dim"], elem_size, hnd)
    raise LayoutError(
        "%s: shape %s with strides %s is not dense in any order the broker "
        "knows (K/V and blocks outermost in either order, then [block_size, "
        "heads] or [heads, block_size], head_dim innermost)" %
        (what, list(shape), list(strides)))
