"""The chunked causal-LM loss (``models/losses.py``) for *stock* Transformers models and ``Trainer``.

This package's ``*ForCausalLM`` use it by themselves when training. A stock ``*ForCausalLM`` (Llama, Qwen2,
Mistral, …) computes the logits of every position before its loss; ``use_chunked_loss(model)`` hooks into
its forward so that a training forward with ``labels`` (under ``Trainer``, ``accelerate`` or a plain loop)
asks the model for the logits of the last position only (``logits_to_keep=1``) and the final hidden states,
and computes the loss with ``chunked_cross_entropy`` from those and the ``lm_head`` weight::

    from transformers import AutoModelForCausalLM, Trainer
    from hf_attn_variants import use_chunked_loss

    model = AutoModelForCausalLM.from_pretrained(...)
    use_chunked_loss(model)          # returns a handle; handle.remove() restores the stock forward
    Trainer(model=model, args=..., train_dataset=...).train()

The loss (shift, ``ignore_index`` -100, ``num_items_in_batch``, ``shift_labels``) and its gradients equal the
stock ones; such a forward returns ``logits=None``. Eval mode, forwards without ``labels`` or without
gradients, and calls with ``logits_to_keep`` are left as they are. Refused in one sentence: models that scale
or cap their logits (``final_logit_softcapping``, ``logit_scale``, ``logits_scaling``), whose loss is not that
of ``lm_head(h)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..models.losses import chunked_cross_entropy

SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose logits are not ``lm_head(h)`` as such (Gemma 2/3, Cohere, Granite)."""

LOSS_KWARGS = ("labels", "shift_labels", "num_items_in_batch")


@dataclass
class ChunkedLossHandle:
    """The two hooks ``use_chunked_loss`` registered; ``remove()`` takes them off."""

    handles: list[Any] = field(default_factory=list)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _check_model(model: nn.Module) -> nn.Linear:
    """The model's LM head; ``ValueError`` naming ``model`` when it has none or its logits are scaled."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Linear):
        raise ValueError(f"model: {type(model).__name__} has no nn.Linear LM head (get_output_embeddings()); "
                         "use_chunked_loss takes a *ForCausalLM")
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in SCALED_LOGITS:
        value = getattr(text, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"model: its config sets {name}={value!r}, so its logits are not lm_head(h) and "
                             "the chunked loss would differ from its own; train it with its stock loss")
    return head


def use_chunked_loss(model: nn.Module, *, chunk_tokens: int | None = None) -> ChunkedLossHandle:
    """Make training forwards of ``model`` (a stock ``*ForCausalLM``) compute the causal-LM loss with
    ``chunked_cross_entropy``, without the logits of the whole batch (module docstring). ``chunk_tokens``: as
    ``chunked_cross_entropy``'s. Returns a handle whose ``remove()`` undoes it."""
    head = _check_model(model)
    pending: list[dict[str, Any] | None] = []

    def before(module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        applies = (module.training and torch.is_grad_enabled() and kwargs.get("labels") is not None
                   and not kwargs.get("logits_to_keep"))
        if not applies:
            pending.append(None)
            return args, kwargs
        taken = {name: kwargs.pop(name, None) for name in LOSS_KWARGS}
        taken["wanted_hidden_states"] = bool(kwargs.get("output_hidden_states"))
        pending.append(taken)
        return args, {**kwargs, "logits_to_keep": 1, "output_hidden_states": True, "return_dict": True}

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        taken = pending.pop()
        if taken is None or output is None:  # not ours, or the forward raised (the hook is always called)
            return output
        if not isinstance(output, ModelOutput) or not output.get("hidden_states"):
            raise ValueError(f"model: {type(module).__name__} returned no hidden states with "
                             "output_hidden_states=True; use_chunked_loss needs them")
        shifted = taken["shift_labels"]
        loss = chunked_cross_entropy(output.hidden_states[-1], head.weight,
                                     taken["labels"] if shifted is None else shifted, bias=head.bias,
                                     shift=shifted is None, num_items_in_batch=taken["num_items_in_batch"],
                                     chunk_tokens=chunk_tokens)
        fields = {key: value for key, value in output.items() if key != "logits"}
        if not taken["wanted_hidden_states"]:
            fields.pop("hidden_states")
        return type(output)(**{**fields, "loss": loss})

    return ChunkedLossHandle([model.register_forward_pre_hook(before, with_kwargs=True),
                              model.register_forward_hook(after, with_kwargs=True, always_call=True)])


__all__ = ["ChunkedLossHandle", "use_chunked_loss"]
