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

From vLLM 0.29 a worker gets 4-D ``[B, H, N, C]`` views over one int8 buffer
(K and V packed in C; B kernel blocks of N tokens, ``block_size / N`` of
them per manager block); ``derive_view`` reads those: see the broker's
PACKED layout and docs/vllm.md.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_FIRST = 0  # KVB_KV_KV_FIRST
BLOCK_FIRST = 1  # KVB_KV_BLOCK_FIRST
PACKED = 2  # KVB_KV_PACKED: [num_blocks, block_size, heads, head_dim]
_U32 = 1 << 32


class LayoutError(ValueError):
    """The tensor is laid out in a way the broker's geometry cannot say."""


@dataclass(frozen=True)
class LayerLayout:
    layout: int  # KV_FIRST, BLOCK_FIRST or PACKED
    num_blocks: int
    block_size: int
    num_heads: int  # in the geometry given to the broker
    head_dim: int
    elem_size: int
    hnd: bool  # heads before tokens inside a block: whole blocks only
    heads: int = 0  # the KV heads this rank holds (0: num_heads)
    layers: int = 1  # vLLM layers in one block row (block-major views)
    form: str = ""  # the vLLM layout name, for messages

    @property
    def nbytes(self) -> int:
        planes = 1 if self.layout == PACKED else 2
        return (planes * self.num_blocks * self.block_size * self.num_heads *
                self.head_dim * self.elem_size)

    @property
    def kv_heads(self) -> int:
        return self.heads or self.num_heads

    @property
    def name(self) -> str:
        if self.layout == PACKED:
            return "PACKED/%s" % (self.form or ("HND" if self.hnd else "NHD"))
        return "%s/%s" % ("KV_FIRST" if self.layout == KV_FIRST else
                          "BLOCK_FIRST", "HND" if self.hnd else "NHD")


@dataclass(frozen=True)
class ViewInfo:
    """One vLLM >= 0.29 layer view [B, H, N, C], read from its strides."""
    nhc: bool  # tokens outside heads inside a kernel block (xxNHC)
    kblocks: int  # B: kernel blocks
    heads: int  # H
    ktokens: int  # N: tokens per kernel block
    cdim: int  # C: K and V of a head, in elements
    ratio: int  # kernel blocks per manager block
    block_stride: int  # bytes between kernel blocks
    page: int  # bytes of one kernel block
    elem_size: int

    @property
    def num_blocks(self) -> int:
        return self.kblocks // self.ratio

    @property
    def block_size(self) -> int:
        return self.ktokens * self.ratio


_LAYOUT_HINT = ("set VLLM_KV_CACHE_LAYOUT=LBNHC (vLLM's default; LBHNC, "
                "BLNHC and BLHNC work too)")


def derive_view(shape, strides, elem_size: int, block_size: int,
                what: str = "tensor") -> ViewInfo:
    """A vLLM >= 0.29 per-layer view [B, H, N, C] (kernel-block granular,
    K and V packed in C) with the scheduler's block_size, or LayoutError.
    Blocks must be dense pages [N, H, C] or [H, N, C]; how far apart they
    are (one page: layer-major LB*; several layers' pages: block-major BL*)
    is the caller's to use."""
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if len(shape) != 4:
        raise LayoutError("%s: shape %s is not a [B, H, N, C] view" %
                          (what, list(shape)))
    b, h, n, c = shape
    sb, sh, sn, sc = strides
    if min(shape) < 1 or elem_size not in (1, 2, 4, 8):
        raise LayoutError("%s: shape %s, element size %d: unsupported" %
                          (what, list(shape), elem_size))
    if c > 1 and sc != 1:
        raise LayoutError("%s: strides %s: the last dimension (K and V of a "
                          "head) is not dense" % (what, list(strides)))
    if (h == 1 or sh == c) and (n == 1 or sn == h * c):
        nhc = True
    elif (n == 1 or sn == c) and (h == 1 or sh == n * c):
        nhc = False
    else:
        raise LayoutError(
            "%s: shape %s with strides %s: a kernel block is not one dense "
            "page (heads outside blocks: LHBNC or BHLNC); %s" %
            (what, list(shape), list(strides), _LAYOUT_HINT))
    page = h * n * c
    if b > 1 and sb < page:
        raise LayoutError("%s: shape %s with strides %s: blocks overlap or "
                          "are not outermost; %s" % (what, list(shape),
                                                    list(strides),
                                                    _LAYOUT_HINT))
    if block_size < n or block_size % n:
        raise LayoutError("%s: %d tokens per kernel block do not divide the "
                          "block size %d" % (what, n, block_size))
    ratio = block_size // n
    if b % ratio:
        raise LayoutError("%s: %d kernel blocks are not whole blocks of %d "
                          "tokens" % (what, b, block_size))
    if ratio > 1 and b > 1 and sb != page:
        raise LayoutError("%s: kernel blocks of %d tokens that are not "
                          "dense pages; %s" % (what, n, _LAYOUT_HINT))
    for v in (b // ratio, block_size, h, c):
        if v >= _U32:
            raise LayoutError("%s: %d does not fit 32 bits" % (what, v))
    if b == 1:
        sb = page
    return ViewInfo(nhc, b, h, n, c, ratio, sb * elem_size, page * elem_size,
                    elem_size)


def view_layout(v: ViewInfo, layers: int = 1, form: str = "") -> LayerLayout:
    """The broker geometry of a view's blocks: PACKED [num_blocks,
    block_size, heads, C]. layers > 1: `layers` vLLM layers' pages lie
    side by side in each block row (block-major BL* layouts), and the row
    is the block: [layers * block_size, heads, C] for xxNHC. HND pages (and
    kernel blocks split from them) move only whole: the geometry says one
    "head" of the whole row, so that a broker never splits it."""
    if v.nhc:
        return LayerLayout(PACKED, v.num_blocks, v.block_size * layers,
                           v.heads, v.cdim, v.elem_size, False, v.heads,
                           layers, form or "NHC")
    return LayerLayout(PACKED, v.num_blocks, v.block_size * layers, 1,
                       v.heads * v.cdim, v.elem_size, True, v.heads, layers,
                       form or "HNC")


def _expected_strides(sizes: dict, outer: tuple, inner: tuple) -> dict:
    """Dense strides (in elements) for the physical order outer + inner +
    ('dim',)."""
    order = outer + inner + ("dim",)
    strides, step = {}, 1
    for name in reversed(order):
        strides[name] = step
        step *= sizes[name]
    return strides


def _derive_mla(shape, strides, elem_size: int, what: str) -> LayerLayout:
    """An MLA layer (vLLM <= 0.28): one latent cache [num_blocks,
    block_size, latent_dim], dense; the same bytes on every TP rank. It
    moves as a PACKED layer of one head of latent_dim elements."""
    nb, bs, dim = shape
    if min(shape) < 1 or elem_size not in (1, 2, 4, 8) or \
            max(shape) >= _U32:
        raise LayoutError("%s: MLA shape %s, element size %d: unsupported" %
                          (what, list(shape), elem_size))
    want = (bs * dim, dim, 1)
    if any(n != 1 and s != w for n, s, w in zip(shape, strides, want)):
        raise LayoutError(
            "%s: MLA shape %s with strides %s is not dense [num_blocks, "
            "block_size, latent_dim]" % (what, list(shape), list(strides)))
    return LayerLayout(PACKED, nb, bs, 1, dim, elem_size, False, form="MLA")


def derive(shape, strides, elem_size: int, what: str = "tensor") -> LayerLayout:
    """The geometry of one layer's KV tensor, or LayoutError saying why not.

    shape and strides are in elements (torch's .shape and .stride()).
    """
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if len(shape) == 3:
        return _derive_mla(shape, strides, elem_size, what)
    if len(shape) != 5:
        raise LayoutError(
            "%s: shape %s: the broker needs [2, num_blocks, block_size, "
            "heads, head_dim] or [num_blocks, 2, block_size, heads, "
            "head_dim], or an MLA latent cache [num_blocks, block_size, "
            "latent_dim]; cross-layer KV blocks (6 dims) are not supported"
            % (what, list(shape)))
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
