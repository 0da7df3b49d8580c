"""Label-smoothed cross-entropy (Szegedy et al., 2016; the paper's §5.4 with ε_ls = 0.1).

The paper notes that smoothing "hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU". The smoothed target distribution is the Annotated Transformer's ``LabelSmoothing``:
``1 - ε`` on the reference token, ``ε / (V - 2)`` on every other token except ``<pad>``, which gets none
(``<pad>`` is never a prediction), and padded positions count nothing. PyTorch's
``cross_entropy(label_smoothing=ε)`` differs: it spreads ``ε / V`` over all ``V`` tokens, ``<pad>``
included.

We return the cross-entropy with that distribution, ``-Σ_j p_j log q_j``, the quantity fairseq reports.
The Annotated Transformer's ``KLDivLoss`` is the same minus the distribution's entropy, a constant: the
gradients are identical. The plain negative log-likelihood is returned too, for perplexity.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from attnkit.cpu.linear import linear
from attnkit.models import unwrap


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and NLL over non-pad targets: logits ``(B, T, V)``, target ``(B, T)``."""
    smoothed, nll = token_losses(logits, target, epsilon, pad_id)
    return smoothed.sum(), nll.sum()


def token_losses(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each target token's smoothed loss and (detached) NLL, ``(B, T)`` each, zero at padding.

    One log-softmax, in float32 at least whatever the logits' dtype (bf16 logits are not copied to
    float32 first: the kernel reads them and writes float32).
    """
    V = logits.size(-1)
    log_q = logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (B, T, V)
    keep = target != pad_id  # (B, T)
    safe_target = target.masked_fill(~keep, 0).unsqueeze(-1)  # pad positions are zeroed below anyway
    log_q_ref = log_q.gather(-1, safe_target).squeeze(-1)  # (B, T)
    smoothed = _smoothed(log_q_ref, log_q.sum(-1), log_q[..., pad_id], V, epsilon)
    nll = -log_q_ref.detach()
    zero = log_q.new_zeros(())
    return torch.where(keep, smoothed, zero), torch.where(keep, nll, zero)


def _smoothed(log_q_ref: Tensor, log_q_sum: Tensor, log_q_pad: Tensor, V: int, epsilon: float) -> Tensor:
    """``-Σ_j p_j log q_j`` from the reference's, all tokens' summed and ``<pad>``'s log-probabilities:
    ``p`` puts ``1 - ε`` on the reference and ``ε / (V - 2)`` on every other token but ``<pad>``."""
    log_q_others = log_q_sum - log_q_ref - log_q_pad  # Σ over j ∉ {reference, <pad>}
    return -(1.0 - epsilon) * log_q_ref - epsilon / (V - 2) * log_q_others


def generative_loss(
    model: nn.Module, inputs: tuple[Tensor, ...], target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """A generative model's summed label-smoothed loss and per-token NLL ``(B, T)`` for ``target``:
    ``model(*inputs, project=False)`` gives the states its ``output_layer`` would project, and
    :func:`projected_loss` projects them chunk by chunk. A model whose output is no single projection
    (``copies``: a pointer-generator's mixture) gives its log-probabilities instead. (``model`` may be
    wrapped in DDP.)"""
    if getattr(unwrap(model), "copies", False):
        smoothed, nll = token_losses(model(*inputs), target, epsilon, pad_id)
        return smoothed.sum(), nll
    hidden = model(*inputs, project=False)
    return projected_loss(hidden, unwrap(model).output_layer, target, epsilon, pad_id)


def projected_loss(
    hidden: Tensor, output_layer: nn.Linear, target: Tensor, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_loss` of ``output_layer(hidden)`` without holding the logits: the summed
    smoothed loss, and each target token's NLL ``(B, T)`` (detached, zero at padding).

    ``hidden (B, T, d)`` are the states the output layer (the Generator's pre-softmax map) would
    project to ``(B, T, V)`` logits. Those are the largest tensors of a language model's training step
    (GPT-2's 50,257 tokens: 206 MB for a batch of 1,024 tokens, and as much again for their gradient and
    for the log-softmax), and reading and writing them costs more time than the softmax itself. Here
    they are made a few rows at a time, as Liger Kernel's fused linear cross-entropy does: each chunk's
    logits give its loss and, right away, its gradient ``softmax - p`` (the smoothed target
    distribution ``p`` sums to one), which is multiplied back into the gradients of the hidden states and
    of the output layer while the chunk is still in cache; backward then only scales them.
    """
    track = torch.is_grad_enabled()  # (the forward of an autograd.Function runs with gradients off)
    return _ProjectedLoss.apply(
        hidden, output_layer.weight, output_layer.bias, target, epsilon, pad_id, track
    )


_CHUNK_LOGITS = 2**21  # logits computed at once: 8 MB in float32, a chunk of 41 rows of GPT-2's vocabulary


def _smoothed_rows(z: Tensor, ref: Tensor, keep: Tensor, epsilon: float, pad_id: int, gradient: bool):
    """Rows of logits ``z (n, V)`` -> their smoothed losses and reference log-probabilities ``(n,)``
    (zero where ``keep`` is False), and with ``gradient`` the loss's gradient ``softmax(z) - p``
    ``(n, V)``, written over ``z``."""
    V = z.size(-1)
    lse = z.logsumexp(-1)  # (n,)
    log_q_ref = z.gather(-1, ref[:, None]).squeeze(-1) - lse
    smoothed = _smoothed(log_q_ref, z.sum(-1) - V * lse, z[:, pad_id] - lse, V, epsilon)
    smoothed, log_q_ref = torch.where(keep, smoothed, 0.0), torch.where(keep, log_q_ref, 0.0)
    if not gradient:
        return smoothed, log_q_ref, None
    on_other = epsilon / (V - 2)  # p_j for j ∉ {reference, <pad>}; the reference gets 1 - ε
    g = z.sub_(lse[:, None]).exp_().sub_(on_other)  # softmax - p, first as if p were ε/(V-2) everywhere
    g[:, pad_id] += on_other  # p_<pad> = 0
    g.scatter_add_(-1, ref[:, None], g.new_full((len(ref), 1), on_other + epsilon - 1))  # p_ref = 1 - ε
    return smoothed, log_q_ref, g.mul_(keep[:, None])  # padded targets: no gradient


class _ProjectedLoss(torch.autograd.Function):
    """The loss of :func:`projected_loss`, its gradients computed in the forward pass, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, epsilon, pad_id, track):
        rows, targets = hidden.reshape(-1, hidden.size(-1)), target.reshape(-1)  # (N, d), (N,)
        keep = targets != pad_id
        refs = targets.masked_fill(~keep, 0)  # padded rows look up any token; their loss is zeroed
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        W, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        exact = torch.promote_types(dtype, torch.float32)  # the softmax's dtype: float32 at least
        wants = ctx.needs_input_grad[:3] if track else (False,) * 3
        dh = torch.empty_like(rows) if wants[0] else None
        dW = torch.zeros_like(weight, dtype=exact) if wants[1] else None
        db = torch.zeros(len(W), dtype=exact, device=hidden.device) if wants[2] else None
        total, log_q_ref = rows.new_zeros((), dtype=exact), rows.new_zeros(len(rows), dtype=exact)
        step = max(1, _CHUNK_LOGITS // len(W))
        with torch.autocast(device, enabled=False):
            for s in range(0, len(rows), step):
                h, part = rows[s : s + step].to(dtype), slice(s, s + step)
                z = linear(h, W, b, inference=False).to(exact)  # (n, V) logits
                smoothed, log_q_ref[part], g = _smoothed_rows(
                    z, refs[part], keep[part], epsilon, pad_id, any(wants)
                )
                total += smoothed.sum()
                if g is None:
                    continue
                g = g.to(dtype)
                if dh is not None:
                    dh[part] = linear(g, W.t(), inference=False)  # (n, V) @ (V, d)
                if dW is not None and dtype == exact:
                    dW.addmm_(g.t(), h)  # (V, n) @ (n, d), added in place
                elif dW is not None:  # multiplied in the autocast dtype, summed in float32
                    dW += (g.t() @ h).to(exact)
                if db is not None:
                    db += g.sum(0, dtype=exact)
        ctx.grads = (
            None if dh is None else dh.view_as(hidden),
            None if dW is None else dW.to(weight.dtype),
            None if db is None else db.to(bias.dtype),
        )
        nll = -log_q_ref.view_as(target)
        ctx.mark_non_differentiable(nll)
        return total, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, d_total: Tensor, d_nll: Tensor) -> tuple[Tensor | None, ...]:
        grads = tuple(None if g is None else g * d_total.to(g.dtype) for g in ctx.grads)
        ctx.grads = None
        return (*grads, None, None, None, None)
