"""The linear map ``y = x Wᵀ + b`` multiplied by oneDNN on CPU: :class:`OneDNNLinear`, which
:func:`attnkit.cpu.speed_up` swaps in for every ``nn.Linear`` of a model.

Why not plain ``F.linear``: on CPU, PyTorch's float32 ``F.linear`` multiplies through its BLAS, which is
MKL in the official wheels, and on AMD processors (most cloud machines) MKL runs a slower code path. The
same wheels ship oneDNN, whose kernels PyTorch already uses for bfloat16 and in ``torch.compile``'s
frozen CPU graphs. On a 2-core AMD EPYC oneDNN multiplied GPT-2's projections faster for training's
many rows, faster still for generation's few, and fastest for its output projection over 50,257 tokens
(``bench/linear.py``; the figures are in docs/benchmarks.md). Same float32 arithmetic, other summation
order.

:func:`linear` takes oneDNN for float32 tensors on a CPU (with gradients, through :class:`_OneDNNLinear`),
and ``F.linear`` everywhere else: GPUs, float64, bfloat16 (torch's own path is oneDNN already), under
autocast, inside ``torch.compile`` (which lowers ``F.linear`` itself, to oneDNN when it freezes weights),
and whenever ``torch.backends.mkldnn`` is unavailable or switched off
(``with torch.backends.mkldnn.flags(enabled=False):``), and for multiplies too small to pay: a oneDNN
call costs about 15 µs more, and it was never faster for weights under 2^17 numbers (256 × 256 and
smaller); from there it is taken from 2^22 multiply-adds, or from 2^19 weights (2 MiB, read from memory
at every call: the few-row case). :class:`OneDNNLinear` is ``nn.Linear`` with that forward: the same
parameters and state-dict keys, so checkpoints and conversions do not change.

For inference, :func:`pack_for_inference` also keeps each weight in oneDNN's own blocked layout, as
``torch.compile``'s frozen CPU graphs and CTranslate2 do, so that oneDNN does not rearrange it at every
call: the same products, faster, most of all for few rows (``bench/linear.py``, docs/benchmarks.md).
A block of a layer's rows multiplied alone (:meth:`OneDNNLinear.forward_rows`: cross-attention's query
map, and its memory's key and value maps, are blocks of one ``in_proj``) gets a packed copy of its own,
in the precision of a map of its size, and is multiplied as such a map would be.

On a CPU with bf16 matrix units (AMX, AVX512-BF16: ``attnkit.cpu.precision``), the packed copy may be
bf16 (``pack_for_inference(torch.bfloat16)``, what ``decode.precision=bf16`` does): each input is
rounded to bf16 on its way in, the products are summed in float32 by the units, and the output comes
back as float32 with the float32 bias added, so the layer norms, attention, softmax and search around
the maps stay float32. For the Multi30k model's maps that is 2-3.5x faster than float32 from 64 rows
(``bench/linear.py --bf16``), with errors of bf16's rounding (~0.4% of a product). Maps of fewer than
:data:`BF16_MIN_WEIGHTS` weights (256 x 256 and smaller) keep a float32 copy, for any number of rows
(the precision may not depend on the rows: below). In compiled steps, where the rounding is fused into
the operation before the map, maps multiply in bf16 from :data:`COMPILED_BF16_MIN_WEIGHTS` (256 x 256).

**The same answer whatever the batch.** In inference (no gradient wanted) a row's product must not
depend on the rows that come with it, or a sentence's translation would depend on its batchmates
(docs/invariance.md). Two things made it depend on them, and neither is allowed there:

- *choosing the kernel by the number of rows*: float32's ``F.linear`` for few rows and oneDNN for many,
  or a bf16 weight for many rows and float32 for few. In inference every product goes to oneDNN (its
  packed weight where there is one, in its precision), whatever the rows and the weight's size: MKL's
  ``F.linear``, which the small maps took, sums a row in another order for another number of rows
  (6 rows of a 256 x 256 map against 12, with torch 2.13 on a 2-core AMD EPYC);
- *a kernel that sums one row in another order*: oneDNN sums a single float32 row with a
  matrix-vector kernel, so a single row is padded with a zero row to :data:`ONEDNN_MIN_ROWS`. From two
  rows, oneDNN sums every row in the same order for any number of rows and threads, and so do its bf16
  kernels and int8's integer sums (exact) from one; ``tests/cpu/test_linear_rows.py`` checks it bit
  for bit. Except bf16 on AMX tiles, whose kernels block a sum of 512 inputs or more by a cost model
  that counts the rows (:func:`bf16_rows_alike`): there a bf16 map of more inputs than
  :data:`BF16_SUM_INPUTS` is multiplied by blocks of that many inputs, each summed in one pass, their
  products added in float32 in a fixed order (:func:`_bf16_sum`).

Training keeps the fastest choice for each call (its gradients are not expected to be the same bits
in another batch).

The private operations (``torch.ops.mkldnn._linear_pointwise``, ``_reorder_linear_weight``,
``torch._int_mm``) may change with any torch release, so each is tried once on a small example
against its public equivalent before it is used (:func:`_probe_linear`,
:func:`_packing_works`, :func:`_probe_int_mm`); where one is missing or differs, the public path
serves instead.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

# Small examples for the probes: deterministic, so that probing draws nothing from torch's generator.
_X = torch.linspace(-1.0, 1.0, 3 * 8).view(3, 8)  # (rows, d_in)
_W = torch.linspace(1.0, -0.5, 5 * 8).view(5, 8)  # (d_out, d_in)
_B = torch.linspace(0.0, 0.4, 5)


def _probe_linear():
    """oneDNN's fused linear, the op ``torch.compile``'s CPU backend calls, if this build has it and it
    gives ``F.linear``'s product on a small example; None otherwise (``F.linear`` then serves)."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        op = torch.ops.mkldnn._linear_pointwise
        works = torch.allclose(op(_X, _W, _B, "none", [], ""), F.linear(_X, _W, _B), atol=1e-5)
    except (AttributeError, RuntimeError, TypeError):  # not in this build, or its signature changed
        return None
    return op if works else None


_onednn_linear = _probe_linear()  # None: F.linear everywhere
# below these F.linear is as fast or faster (bench/linear.py): see the module docstring
MIN_WEIGHTS, MIN_MULTIPLY_ADDS, ENOUGH_WEIGHTS = 2**17, 2**22, 2**19
# inference pads a single row to two, which oneDNN sums in another order (see the module docstring)
ONEDNN_MIN_ROWS = 2
# a bf16 model's maps of fewer weights keep a float32 copy: at a decoding step's rows, rounding their
# inputs to bf16 costs more than their bf16 product saves (bench/linear.py --bf16), and a small model
# loses accuracy (the quickstart's dates model: 88.7% exact in float32's small maps, 76.7% all in bf16)
BF16_MIN_WEIGHTS = 2**17
# a compiled step (torch.compile) rounds a map's input to bf16 inside the operation before it, for
# nothing, so there a bf16 model's maps multiply in bf16 from this many weights (256 x 256): a
# d_model-256 model's attention output maps and cross-attention queries, float32 below
# BF16_MIN_WEIGHTS in eager steps (the compiled steps of 500 Multi30k sentences, beam 5: 3.8 s against
# 4.4 s with them in float32). The quickstart's small maps (2^14 weights and fewer) stay float32
COMPILED_BF16_MIN_WEIGHTS = 2**16
# in inference, maps of at most this many weights (128 x 128) are multiplied as products summed by torch
# (:func:`_summed_products`): a oneDNN call costs ~30 µs more than their arithmetic
TINY_WEIGHTS = 2**14
# where oneDNN's bf16 kernels do not sum a row alike among any number of rows (AMX tiles: bf16_rows_alike),
# bf16 maps of more inputs than this are summed in blocks of this many (_bf16_sum): up to 448 inputs
# oneDNN's AMX kernels summed every row of 2 to 2,000 alike (torch 2.13)
BF16_SUM_INPUTS = 256
ROWS_AT_ONCE = 64  # rows multiplied at once by _summed_products (their products: 64 x d_out x d_in),
PRODUCTS_AT_ONCE = 2**18  # or more for a tinier map, as many as make this many products


def onednn_applies(x: Tensor, weight: Tensor, packed: bool = False, *, inference: bool = False) -> bool:
    """Whether :func:`linear` multiplies ``x`` by ``weight`` with oneDNN (see the module docstring);
    ``packed``: with the weight already in oneDNN's layout, which pays for any number of rows;
    ``inference``: chosen by the weight alone, whatever the rows. The checks run on every call,
    cheapest and most often decisive first."""
    return (
        _onednn_linear is not None
        # torch.compile and torch.export lower F.linear their own way (oneDNN too); checked before the
        # sizes, which they may trace as symbols: a comparison would fix them to this call's
        and not torch.compiler.is_compiling()
        and x.dtype == torch.float32
        and x.is_cpu
        and (inference or weight.numel() >= MIN_WEIGHTS)
        and (
            packed
            or inference
            or weight.numel() >= ENOUGH_WEIGHTS
            or x.numel() * weight.size(0) >= MIN_MULTIPLY_ADDS
        )
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.enabled
        and not torch.is_autocast_enabled("cpu")
    )


def padded_rows(n: int) -> int:
    """The number of rows oneDNN multiplies for ``n``: the next of 32 sizes per power of two, and at
    least :data:`ONEDNN_MIN_ROWS` (a single row is summed in another order: see the module docstring).

    oneDNN compiles a kernel for each new number of rows (milliseconds, then cached), and a training run
    whose batches hold different numbers of tokens would compile one nearly every step; so the rows are
    padded with zeros to one of these sizes (at most 3% more work, 1.5% on average). Callers that can
    make matrices of this many rows in the first place (packing.py) spare the copy."""
    quantum = 1 << max(0, n.bit_length() - 6)
    return max(ONEDNN_MIN_ROWS, -(-n // quantum) * quantum)


def _multiply(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x (..., d_in) @ weight (d_out, d_in)ᵀ + bias -> (..., d_out)`` by oneDNN, rows padded to
    :func:`padded_rows`. A decoding step calls this about twenty times, so a matrix of rows that needs
    neither padding nor reshaping goes straight through."""
    rows = x if x.dim() == 2 else x.reshape(-1, x.size(-1))  # (N, d_in)
    n = rows.size(0)
    padded = padded_rows(n)
    if padded != n:
        rows = torch.cat([rows, rows.new_zeros(padded - n, rows.size(1))])
    elif not rows.is_contiguous():
        rows = rows.contiguous()
    out = _onednn_linear(rows, weight, bias, "none", [], "")  # (padded, d_out)
    if padded != n:
        out = out[:n]
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.size(-1))


class _OneDNNLinear(torch.autograd.Function):
    """oneDNN's linear with its gradients: ``dx = dy W`` (oneDNN again), ``dW = dyᵀ x``, ``db = Σ dy``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _multiply(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dy_rows = dy.reshape(-1, dy.size(-1))  # (..., d_out) -> (rows, d_out)
        dx = _multiply(dy, weight.t(), None) if ctx.needs_input_grad[0] else None  # (..., d_in)
        dw = dy_rows.t() @ x.reshape(-1, x.size(-1)) if ctx.needs_input_grad[1] else None  # (d_out, d_in)
        db = dy_rows.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def _needs_gradient(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether autograd records ``x Wᵀ + b`` here: gradients on, and one of them requires one."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, inference: bool | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, by oneDNN where :func:`onednn_applies`; in inference each row's
    product the same whatever the rows that come with it (see the module docstring). ``inference``:
    default, wherever no gradient is wanted; a training step's own products made without autograd (the
    fused loss's, ``attnkit.tasks.losses``) pass False, so that training keeps its kernels."""
    if inference is None:
        inference = not _needs_gradient(x, weight, bias)
    if not inference:
        if not onednn_applies(x, weight):
            return F.linear(x, weight, bias)
        if _needs_gradient(x, weight, bias):
            return _OneDNNLinear.apply(x, weight, bias)
        return _multiply(x, weight, bias)
    if _tiny(x, weight):
        return _summed_products(x, weight, bias)
    if onednn_applies(x, weight, inference=True):
        return _multiply(x, weight, bias)
    return F.linear(x, weight, bias)


def _tiny(x: Tensor, weight: Tensor) -> bool:
    """Whether inference multiplies ``x`` by ``weight`` with :func:`_summed_products`."""
    return (
        weight.numel() <= TINY_WEIGHTS
        and x.dtype == weight.dtype == torch.float32
        and x.is_cpu
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
    )


def _summed_products(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x (..., d_in) @ weight (d_out, d_in)ᵀ + bias -> (..., d_out)`` as products summed over
    ``d_in`` (:data:`ROWS_AT_ONCE` rows at a time, or :data:`PRODUCTS_AT_ONCE` products): each output
    one sum of a row's own products, in an order fixed by ``d_in``, whatever the rows beside it; for
    maps so small (:data:`TINY_WEIGHTS`) that a kernel call costs more than their arithmetic."""
    # contiguous: a view of a transposed input (one image's regions, say) would sum its products in
    # the order of its strides, another than the copy that a batch of them reshapes into
    rows = x.reshape(-1, x.size(-1)).contiguous()  # (N, d_in)
    step = max(ROWS_AT_ONCE, PRODUCTS_AT_ONCE // weight.numel())  # a tinier map: more rows at once
    parts = [(rows[start : start + step, None, :] * weight).sum(-1) for start in range(0, rows.size(0), step)]
    out = torch.cat(parts) if parts else rows.new_zeros(0, weight.size(0))  # (N, d_out)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.size(0))


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` (same parameters, initialisation and state-dict keys) whose forward is :func:`linear`;
    after :meth:`pack_for_inference`, a packed weight, and after :meth:`quantize_int8`, int8 weights for
    CPU inference. :func:`attnkit.cpu.speed_up` makes a model's ``nn.Linear`` layers this class."""

    # int8 weights, transposed (d_in, d_out), and their per-output scales (d_out,): quantize_int8
    int8_weight: Tensor | None = None
    int8_scale: Tensor | None = None
    # the weight in oneDNN's blocked layout, which weight it was made from, and its dtype (float32 or
    # bfloat16): pack_for_inference
    packed_weight: Tensor | None = None
    packed_from: tuple[int, int] | None = None
    packed_dtype: torch.dtype = torch.float32
    # the dtype pack_for_inference was asked for (a map's own copy may be float32 where it is small)
    packed_for: torch.dtype = torch.float32
    # copies of row blocks of the weight (forward_rows), by block: packed, or int8 with their scales;
    # made empty by pack_for_inference and quantize_int8, the only ways to a product that takes them
    blocks: dict
    # whether bf16 products sum a row over d_in in blocks of BF16_SUM_INPUTS inputs: a map of more inputs,
    # where oneDNN's bf16 kernels do not sum a row alike among any number of rows (bf16_rows_alike)
    sums_in_blocks: bool = False

    def forward(self, x: Tensor) -> Tensor:
        return self._map(x, self.weight, self.bias, None)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """``x`` times the rows ``start:stop`` of the weight (and of the bias): one block of this map
        taken alone, as cross-attention takes its queries' map, and its memory's keys' and values', out
        of one ``in_proj``. In inference the block is multiplied as this layer multiplies a map of its
        size (a packed copy of its own, in the precision chosen for its size; its rows of the int8
        weights), not as a float32 slice: a bf16 model's cross-attention then multiplies in bf16 as its
        other maps do."""
        bias = None if self.bias is None else self.bias[start:stop]
        return self._map(x, self.weight[start:stop], bias, (start, stop))

    def _map(self, x: Tensor, weight: Tensor, bias: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        """``x`` times ``weight`` (this layer's, or its ``rows``) plus ``bias``, as the layer multiplies."""
        int8 = self.int8_weight is not None and x.is_cpu and x.dtype == torch.float32
        if int8 and not _needs_gradient(x, weight, bias):
            return self._int8_forward(x, bias, rows)
        if self.packed_weight is None:
            return linear(x, weight, bias)
        if _tiny(x, weight) and not _needs_gradient(x, weight, bias):
            return _summed_products(x, weight, bias)
        # torch.compile lowers F.linear itself (a bf16 weight made from a frozen one is packed once), and
        # cannot trace _packed_applies's data pointers
        if torch.compiler.is_compiling():
            in_bf16 = self.packed_for == torch.bfloat16 and weight.numel() >= COMPILED_BF16_MIN_WEIGHTS
            if not in_bf16 or x.dtype != torch.float32 or _needs_gradient(x, weight, bias):
                return linear(x, weight, bias)
            bf16 = weight.to(torch.bfloat16)
            if not self.sums_in_blocks:
                return _bf16_sum(x, bias, bf16, F.linear)
            # contiguous blocks, which freezing folds into constants and packs for oneDNN (a slice of a
            # weight it left to a loop of its own: a running step 2.5x slower)
            return _bf16_sum(
                x, bias, [(block, bf16[:, block].contiguous()) for block in _input_blocks(bf16)], F.linear
            )
        if not self._packed_applies(x):
            return linear(x, weight, bias)
        packed, dtype = (self.packed_weight, self.packed_dtype) if rows is None else self._packed_block(rows)
        if dtype == torch.bfloat16:
            return _bf16_sum(x, bias, packed, _multiply_unbiased)
        return _multiply(x, packed, bias)

    def _packed_block(self, rows: tuple[int, int]) -> tuple[Tensor, torch.dtype]:
        """The packed copy of the weight's ``rows`` and its dtype, made at its first use from the weight
        the layer's own copy was made from (and made again once that copy is made again)."""
        made = self.blocks.get(rows)
        if made is None or made[0] != self.packed_from:
            made = (self.packed_from, *_packed_copy(self.weight[rows[0] : rows[1]], self.packed_for))
            self.blocks[rows] = made
        return made[1], made[2]

    def pack_for_inference(self, dtype: torch.dtype = torch.float32) -> bool:
        """Keep a copy of the weight in oneDNN's blocked layout for CPU inference (see the module
        docstring), in ``dtype``: float32, or bfloat16 for the processor's bf16 units; True if this
        layer's products go through oneDNN at all. The copy serves only while the weight is unchanged
        (any in-place update, as an optimizer step or ``load_state_dict``, retires it), without
        gradients, for any number of rows (the product must not depend on them: see the module
        docstring)."""
        weight = self.weight
        if not _packing_works(dtype) or not weight.is_cpu or weight.dtype != torch.float32:
            return False
        if weight.is_inference():  # made under torch.inference_mode: no version counter to retire a copy by
            return False
        self.packed_weight, self.packed_dtype = _packed_copy(weight, dtype)
        self.packed_from = (weight.data_ptr(), weight._version)
        self.packed_for, self.blocks = dtype, {}
        self.sums_in_blocks = dtype == torch.bfloat16 and _sums_in_blocks(weight)
        return True

    def _packed_applies(self, x: Tensor) -> bool:
        """:func:`onednn_applies` for the packed weight, checking only what may have changed since it was
        packed (its size, type and device cannot), on every call: cheapest and most often decisive first."""
        weight = self.weight
        return (
            x.dtype == torch.float32
            and x.is_cpu
            and self.packed_from == (weight.data_ptr(), weight._version)
            and not _needs_gradient(x, weight, self.bias)
            and torch.backends.mkldnn.enabled
            and not torch.is_autocast_enabled("cpu")
        )

    def quantize_int8(self) -> None:
        """Multiply by int8 weights from now on, in CPU inference, by dynamic quantisation (as
        ``torch.ao.quantization.quantize_dynamic`` and torchao's int8 weights and activations): each
        output row's weights scaled to [-127, 127] once, each input row per call, products summed in
        int32 (``torch._int_mm``, VNNI instructions where the CPU has them; where it does not work, the
        same sum by public operations, slower), then scaled back to
        float32. About 2.6x fewer cycles than float32 for the output layer of the Multi30k model,
        ~1% error per output. The float32 weights stay: training, tied embeddings and the state dict
        use them, as do gradients and other devices."""
        weight = self.weight.detach().float().cpu()
        scale = (weight.abs().amax(1) / 127).clamp(min=1e-12)  # (d_out,)
        self.int8_weight = (weight / scale[:, None]).round().to(torch.int8).t()  # (d_in, d_out)
        self.int8_scale = scale
        self.int8_product = torch._int_mm if _probe_int_mm() else _int32_product
        self.blocks = {}

    def _int8_forward(self, x: Tensor, bias: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        """``x`` times the int8 weights (their columns ``rows``: each output's scale is its own, so a
        block's int8 weights are those its rows would have alone) plus ``bias``."""
        weight, scale = self.int8_weight, self.int8_scale
        if rows is not None:
            if ("int8", rows) not in self.blocks:  # (contiguous, as the int8 product takes its weights)
                self.blocks["int8", rows] = (
                    weight[:, rows[0] : rows[1]].contiguous(),
                    scale[rows[0] : rows[1]],
                )
            weight, scale = self.blocks["int8", rows]
        flat = x.reshape(-1, x.size(-1))  # (N, d_in)
        x_scale = (flat.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)  # (N, 1)
        quantised = (flat / x_scale).round_().to(torch.int8)
        out = self.int8_product(quantised, weight).float().mul_(x_scale).mul_(scale)
        if bias is not None:
            out.add_(bias)
        return out.view(*x.shape[:-1], -1)  # (..., d_out)


def _packed_copy(weight: Tensor, dtype: torch.dtype) -> tuple[Tensor | list, torch.dtype]:
    """``weight`` in oneDNN's blocked layout, in ``dtype`` (float32 for a bf16 map of fewer than
    :data:`BF16_MIN_WEIGHTS`), and the dtype it took. A bf16 copy of a map of more than
    :data:`BF16_SUM_INPUTS` inputs where :func:`bf16_rows_alike` fails is a list of ``(inputs, packed
    block)``, one per :func:`_input_blocks` block, for :func:`_bf16_sum`."""
    if dtype == torch.bfloat16 and weight.numel() < BF16_MIN_WEIGHTS:
        dtype = torch.float32  # a small map: see BF16_MIN_WEIGHTS
    copy = weight.detach().to(dtype).contiguous()
    if dtype == torch.bfloat16 and _sums_in_blocks(copy):
        return [(block, _reorder(copy[:, block].contiguous())) for block in _input_blocks(copy)], dtype
    return _reorder(copy), dtype


def _reorder(weight: Tensor) -> Tensor:
    """``weight`` (d_out, d_in) in oneDNN's blocked layout for products of any number of rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 128)


def _sums_in_blocks(weight: Tensor) -> bool:
    """Whether a bf16 product by ``weight`` is summed by blocks of inputs (:func:`_bf16_sum`)."""
    return weight.size(1) > BF16_SUM_INPUTS and not bf16_rows_alike()


def _input_blocks(weight: Tensor) -> list[slice]:
    """The blocks of at most :data:`BF16_SUM_INPUTS` of ``weight``'s inputs that :func:`_bf16_sum`
    multiplies one at a time."""
    d_in = weight.size(1)
    return [slice(start, min(start + BF16_SUM_INPUTS, d_in)) for start in range(0, d_in, BF16_SUM_INPUTS)]


def _bf16_sum(x: Tensor, bias: Tensor | None, packed, product) -> Tensor:
    """``x (..., d_in)`` rounded to bf16 times a bf16 weight, summed in float32, back in float32 with
    the float32 bias added (after rounding, not rounded itself). ``packed`` is one weight, or a list of
    ``(inputs, weight block)`` whose products are added in float32 in their order: on AMX tiles
    (:func:`bf16_rows_alike`), oneDNN sums a row of more than :data:`BF16_SUM_INPUTS` inputs in an
    order that depends on the number of rows, and a block of that many in one pass whatever the rows.
    ``product(x, weight)``: the bf16 product of a block (oneDNN's packed, or ``F.linear`` in a compiled
    step)."""
    if isinstance(packed, Tensor):
        out = product(x.to(torch.bfloat16), packed).float()
        return out if bias is None else out.add_(bias)
    # by blocks of inputs, each block's bf16 product added in float32; as a matrix, whose blocks of
    # columns a compiled step multiplies by oneDNN (it multiplied blocks of a (B, 1, d_in) input 10x slower)
    rows = x.reshape(-1, x.size(-1)).to(torch.bfloat16)  # (N, d_in)
    out = None
    for inputs, block in packed:
        part = product(rows[:, inputs], block)  # (N, d_out)
        out = part.float() if out is None else out.add_(part)
    out = out if bias is None else out.add_(bias)
    return out.view(*x.shape[:-1], out.size(-1))  # (..., d_out)


def _multiply_unbiased(x: Tensor, packed: Tensor) -> Tensor:
    """:func:`_multiply` without a bias, as :func:`_bf16_sum` takes it."""
    return _multiply(x, packed, None)


def _int32_product(a: Tensor, b: Tensor) -> Tensor:
    """``torch._int_mm``'s product of two int8 matrices, in int32 by public operations (slower)."""
    return a.to(torch.int32) @ b.to(torch.int32)


@functools.cache
def _probe_int_mm() -> bool:
    """Whether ``torch._int_mm`` multiplies int8 matrices on this CPU as the int32 product does."""
    a = torch.arange(-12, 12, dtype=torch.int8).view(3, 8)
    b = torch.arange(-20, 20, dtype=torch.int8).view(8, 5)
    try:
        return bool(torch.equal(torch._int_mm(a, b), _int32_product(a, b)))
    except (AttributeError, RuntimeError, TypeError):
        return False


@functools.cache
def _packing_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN's blocked weights (``_reorder_linear_weight``) of ``dtype`` give ``F.linear``'s
    product here (bf16: within its rounding)."""
    if _onednn_linear is None:
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(_W.to(dtype), 128)
        product = _onednn_linear(_X.to(dtype), packed, None, "none", [], "").float() + _B
        return torch.allclose(product, F.linear(_X, _W, _B), atol=1e-5 if dtype == torch.float32 else 2e-2)
    except (AttributeError, RuntimeError, TypeError):
        return False


@functools.cache
def bf16_rows_alike() -> bool:
    """Whether this CPU's oneDNN multiplies a row by a packed bf16 weight to the same bits among any
    number of rows (what batch invariance needs of a bf16 model: docs/invariance.md). On processors with
    AMX tiles, oneDNN 3.x blocks the sum over ``d_in`` by a cost model of the whole product, so rows
    multiplied among 33 to a few hundred others are summed in another order than among 32 or fewer (for
    maps of 512 inputs and more, torch 2.13); its AVX-512 bf16 kernels sum every row alike. Probed once
    per process on a 512 x 512 map; False where bf16 products are not had at all. Where it is False,
    :func:`_packed_copy` packs wide bf16 maps by blocks of inputs, which are summed alike."""
    if not _packing_works(torch.bfloat16):
        return False
    generator = torch.Generator().manual_seed(0)
    packed = _reorder(torch.randn(512, 512, generator=generator).bfloat16())
    x = torch.randn(300, 512, generator=generator).bfloat16()
    first = _multiply(x[:32], packed, None)  # (a flip of one bit in ~8,000 outputs)
    return all(torch.equal(_multiply(x[:rows], packed, None)[:32], first) for rows in (40, 64, 100, 160, 300))


def as_onednn(model: nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` a :class:`OneDNNLinear`, in place (the same parameters,
    only the forward changes), and give :func:`linear` to the modules that multiply by weights of their
    own through a ``linear`` attribute that is ``F.linear`` (the RNN decoder's cells, the mean bridge);
    returns how many. Nothing where this build has no oneDNN linear."""
    if _onednn_linear is None:
        return 0
    layers = [module for module in model.modules() if type(module) is nn.Linear]
    for layer in layers:
        layer.__class__ = OneDNNLinear
    own = [module for module in model.modules() if getattr(module, "linear", None) is F.linear]
    for module in own:
        module.linear = linear
    return len(layers) + len(own)


def quantize_int8(model: nn.Module) -> int:
    """:meth:`OneDNNLinear.quantize_int8` for every linear layer of ``model`` (plain ``nn.Linear``
    layers become :class:`OneDNNLinear` first); returns how many."""
    layers = [module for module in model.modules() if type(module) in (nn.Linear, OneDNNLinear)]
    for layer in layers:
        layer.__class__ = OneDNNLinear
        layer.quantize_int8()
    return len(layers)


def linear_precision(model: nn.Module) -> str:
    """What ``model``'s linear maps multiply in for inference: ``"int8"`` after :func:`quantize_int8`,
    ``"bf16"`` after :func:`pack_for_inference` in bfloat16, ``"fp32"`` otherwise."""
    layers = [module for module in model.modules() if isinstance(module, OneDNNLinear)]
    if any(layer.int8_weight is not None for layer in layers):
        return "int8"
    if any(layer.packed_weight is not None and layer.packed_dtype == torch.bfloat16 for layer in layers):
        return "bf16"
    return "fp32"


def pack_for_inference(model: nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """:meth:`OneDNNLinear.pack_for_inference` in ``dtype`` for every :class:`OneDNNLinear` of ``model``
    (in bf16, the maps of fewer than :data:`BF16_MIN_WEIGHTS` weights in float32); returns how many
    took it."""
    layers = [module for module in model.modules() if isinstance(module, OneDNNLinear)]
    return sum(layer.pack_for_inference(dtype) for layer in layers)
