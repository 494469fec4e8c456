"""Size limits of the code, so that a later change cannot grow them silently (issue 36).

- Exported remote code: the lines of every file a causal LM's folder holds, per family, and of the family's
  own ``modeling_<family>.py`` (what a Hub user reads before running ``trust_remote_code=True``).
- Repeated code in ``src``: runs of ``WINDOW`` identical statement lines (stripped; blank lines, comments,
  docstrings and imports left out) that stand in two places, one count per pair of places.
- Function length in ``src``.

A limit is raised only on purpose, with the reason next to it. Issue 36's targets were 60 % of the exported
totals of 2026-11-26 (entropy-invariant 1,450, GAU 2,150, Synthesizer 1,550 lines) and a family file of at
most 700 lines (GAU 1,100); where a limit is above its target, the reason says what the lines hold.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

import hf_attn_variants
from hf_attn_variants.models.standalone import exported_files

SRC = Path(hf_attn_variants.__file__).resolve().parent
REMOTE = SRC / "models" / "remote"
"""Package data: the committed remote code, generated from ``models/`` (counted below, per family)."""

EXPORTED_LINES = {
    # Above the 1,450 target: the shared file (1,591 lines, counted in every family). By capability:
    # Transformers 5.0-5.24 compat 74, tensor parallelism from remote code 150, pruned heads 81, packed
    # documents 38, RoPE/norms 137, masks, nᵢ and log-n 147, config and its validation 254, geometry, layer
    # and feed-forward 103, PreTrainedModel base (init, FSDP2 tie and sharded save) 87, backbone with input
    # checks 174, the five task heads 226; imports, module docstring and __all__ the rest (CONTRIBUTING.md).
    # The family's own files grew by the per-layer position schemes of issue 39 (no_rope_layers and
    # attention_scale_layers, their checks and docstrings): 2,000 lines in all. Issue 48 added the
    # one-sentence refusal of FlexAttention on CUDA with heads under 16 dimensions (check_flex_head_size).
    # Issue 47 added the chunked causal-LM cross-entropy the causal LM heads train with (losses.py, inlined
    # into the shared file with the head's choice of it: 182 lines in every family's total).
    # Issue 50 documented every argument of the model code with its shape and dtype (Google convention, ruff's
    # D rules on models/): +817 docstring lines in this family's folder (the shared file +703 of them), while
    # its lines less docstrings fell from 1,777 to 1,772 (EXPORTED_CODE_LINES).
    # Issue 45, an audit of the Python API: +22 (17 code, 5 docstring) in the shared backbone for one
    # ValueError for a 1D or 3D attention_mask (the Synthesizer's positions ran a 3D one at batch 1 and gave
    # other logits than no mask) and for position_ids outside the learned absolute positions (an IndexError);
    # +3 for eos_token_id checked as pad and bos are (a string failed deep in generate).
    # Issue 45, a second audit: +15 (11 code, 4 docstring) for head indices checked as integers (is_index): a
    # pruned_heads of {0: [True]} pruned head 1, and 1.5 head 1 (int() took them); a bool tensor, a float
    # tensor or an array is refused in the same ValueError.
    # Issue 45, left by its audits: +12 code lines for fields of other families refused in one ValueError
    # instead of kept and ignored (AttnVariantConfig.not_applicable: no_rope_layers outside the
    # entropy-invariant family; the family itself keeps the field; None or empty is taken; the message
    # says to delete the key from a config.json saved with it).
    # Issue 45, an audit of the integrations: +10 (5 code, 5 docstring) in the shared file for a model with
    # pruned_heads refused under vLLM's attention in one sentence naming restate_uniform_heads
    # (serving_refusal(config)); vLLM failed deep in a tensor view.
    # Issue 45, an audit of PreTrainedModel features and generation: +59 (29 code, 30 docstring) in the shared
    # file for the stock models' log-n attention names refused (get_correct_attn_implementation: Transformers
    # accepts any registered name, and this family squared the factor under attn_implementation=
    # "entropy_invariant"), continuous batching refused in one sentence (init_continuous_batching: every
    # request failed in the manager's thread), a causal config in a bidirectional head said once (logger),
    # nᵢ following the mask over given positions (visible_key_counts' docstring), and a pad_token_id past the
    # vocabulary refused by the config (torch's AssertionError deep in the embedding).
    # +5 (4 code) in the shared file for leading_padding, the count of leading padding the FLASH warning and
    # the Synthesizer's pattern rows share (each wrote it out).
    # +32 (15 code) in the shared file for the chunked loss's power-of-two chunk count (chunk_layout): a
    # compiled step with labels compiled again at every batch × length, and ran eagerly after eight.
    # +1 for the attention dropout read from the config once, when the attention is built (a compiled,
    # checkpointed training step of a model of another dropout failed: EXPORTED_CODE_LINES).
    # +14 for widest_dtype in the shared file: packed FLASH's per-document sums were float64,
    # which MPS does not have (a TypeError there); float32 on MPS.
    # +13 (8 code, 5 docstring) for the fields forward read from the config, read once when built instead
    # (the factor's three fields, the backbone's needs_key_counts; the learned-position check reads the
    # table): torch < 2.11's dynamo guards no config attribute, so a second compiled model kept the first
    # one's values.
    # Model inputs, an audit of the model classes: +57 (41 code) in the shared file for the sequence
    # classifier pooling each row's first token after left padding (it pooled a [PAD] query), non-zero
    # token_type_ids said once (a second segment is read as the first), masks, positions and embeddings of
    # another shape named (they failed deep in a layer; a [1, T] mask broadcast for FLASH too) and
    # layer_norm_eps = 0 refused (NaN on padded batches).
    # +3 in the shared file: head_dim checked even under RoPE (EXPORTED_CODE_LINES says why).
    "entropy_invariant": 3261,
    # Above the 2,150 target: the shared file, GAU's torch kernels (gau_kernels.py: blocked quadratic kernels,
    # FLASH and its packed-document layout), its chunk cache, and the Triton kernels (gau_triton.py). Issue 37
    # added the one-token FLASH step that Transformers' cache and vLLM's native model share
    # (flash_decode_step), the unit's projection and FLASH inputs as methods vLLM calls, and layer_types.
    # Issue 47: the chunked causal-LM loss in the shared file, as for the entropy-invariant family (+182),
    # and FLASH as one op with three implementations (+515): the op's dispatcher, its FlashState (open
    # chunk + state, so caches and vLLM continue mid-chunk), its reference and the chunk-state sums and their
    # transpose shared by the torch and Triton paths (gau_kernels.py, +225); the Triton kernels of the whole
    # op (states per chunk, forward, two backward kernels), their torch.library ops with shapes for tracing
    # and their launch grids (gau_triton.py, +258); the unit split into a quadratic and a FLASH class with
    # recomputation (modeling_gau.py, +32); then +24 for the docstrings naming the op's implementations and
    # kernels, the unit's qk_rows, one jit helper of the kernels and the op's refusal without triton; +4
    # for per_chunk, so that the torch path broadcasts the one bidirectional state instead of copying it.
    # Issue 50: +1,588 docstring lines for the documented arguments (shared file +703, gau_kernels +268,
    # modeling_gau +484, gau_triton +108, config +25); lines less docstrings 3,303 → 3,295.
    # Issue 47, the kernels' resources (EXPORTED_CODE_LINES): +34 code lines and +48 docstring lines for the
    # launch options, the transposed scores of the key kernel and the whole-chunk switch; +6 (2 code, 4
    # docstring) for "auto" taking the Triton kernels for bf16/fp16 inputs only; +29 (11 code, 18 docstring)
    # for the float32 launch.
    # Issue 48, the declared minimum torch 2.7: +9 (FlashInputs.tensors, 2 code and 7 docstring lines, and
    # RECOMPUTED_PATHS as a tuple on one line), as dynamo 2.7–2.8 cannot trace a frozenset's `in` nor a slice
    # of a named tuple.
    # Issue 47, a review of the op: +14 (8 code, 6 docstring) for the Triton implementation's differentiable
    # final state, its refusal of dropout and the int64 row offsets of every kernel (EXPORTED_CODE_LINES);
    # +23 (7 code, 16 docstring) for the quadratic kernels' broadcast masks (dense_mask).
    # Issue 47, float16 at long context: +77 (35 code, 42 docstring) for the states past 2¹⁵ scaled before
    # q'·H_c (state_scales, scales_states, state_product, and the kernels' SCALED branch and _state_scale).
    # Issue 47, the op's arguments checked before any implementation runs: +49 (42 code, 7 docstring) for
    # check_flash_arguments (the Triton kernels index by the shapes: a mismatched value read and wrote out of
    # bounds); +1 docstring line saying that the kernels' σ has no upper bound (state_scales).
    # Issue 45, an audit of the Python API: +22 (17 code, 5 docstring) in the shared backbone for one
    # ValueError for a 1D or 3D attention_mask (the Synthesizer's positions ran a 3D one at batch 1 and gave
    # other logits than no mask) and for position_ids outside the learned absolute positions (an IndexError);
    # +3 for eos_token_id checked as pad and bos are (a string failed deep in generate).
    # Issue 45, a second audit: +15 (11 code, 4 docstring) for head indices checked as integers (is_index): a
    # pruned_heads of {0: [True]} pruned head 1, and 1.5 head 1 (int() took them); a bool tensor, a float
    # tensor or an array is refused in the same ValueError.
    # Issue 48, a review for the GPU: +57 (30 code, 27 docstring) for one dtype at the Triton kernels (under
    # bf16 autocast RoPE's float32 angles made q, k float32 beside a bf16 v, which tl.dot refuses on a GPU:
    # the unit casts the rotated q, k back to its dtype, the op casts to autocast's, an open chunk kept
    # outside autocast included (autocast_dtype, autocast_inputs; CPU and CUDA only, since
    # is_autocast_enabled raises for the meta device of scripts/memory_estimates.py), and refuses mixed
    # dtypes outside it) and for float64 refused on a GPU (check_compilable: the compiler rejects it; the
    # interpreter runs it).
    # Issue 45, left by its audits: +12 code lines for fields of other families refused in one ValueError
    # instead of kept and ignored (AttnVariantConfig.not_applicable: no_rope_layers outside the
    # entropy-invariant family; GAU's head_dim, pruned_heads, num_attention_heads and intermediate_size).
    # Issue 45, an audit of the integrations: +10 in the shared file (pruned_heads under vLLM, as above), +10
    # (6 code, 4 docstring) for gau_kernel='triton' on CPU tensors outside Triton's interpreter refused in one
    # ValueError (INTERPRETED, check_compilable; Triton failed with "0 active drivers"), and the refusal
    # under vLLM's Transformers backend naming model_impl and the wheel (it said pip install of a package
    # that is on no index).
    # Issue 45, an audit of PreTrainedModel features and generation: +59 (29 code, 30 docstring) in the shared
    # file for the stock models' log-n attention names refused (get_correct_attn_implementation: Transformers
    # accepts any registered name, and this family squared the factor under attn_implementation=
    # "entropy_invariant"), continuous batching refused in one sentence (init_continuous_batching: every
    # request failed in the manager's thread), a causal config in a bidirectional head said once (logger),
    # nᵢ following the mask over given positions (visible_key_counts' docstring), and a pad_token_id past the
    # vocabulary refused by the config (torch's AssertionError deep in the embedding).
    # +48 (27 code, 21 docstring) in GAU's files: one warning for left padding off FLASH's chunk grid
    # (warn_off_grid_padding; batched generate and pipelines differed from one-prompt runs silently), a
    # decoding step refused for a cache of other rows (its state broadcast), and the relu² docstrings.
    # +5 (4 code) in the shared file for leading_padding, the count of leading padding the FLASH warning and
    # the Synthesizer's pattern rows share (each wrote it out); modeling_gau.py one line shorter.
    # +32 (15 code) in the shared file for the chunked loss's power-of-two chunk count (chunk_layout): a
    # compiled step with labels compiled again at every batch × length, and ran eagerly after eight.
    # +9 (4 code) in gau_kernels.py for quadratic GAU's query blocks counted the same way (per length before).
    # +112 (71 code) for flash_packed_windows and its path: packed rows compiled held an n × n map per layer
    # (the chunk-aligned layout is read on the host); gau_kernels.py +98, modeling_gau.py +14.
    # +10 (2 code) in gau_kernels.py: never-empty query blocks (c ≤ √T_q), chunks padded while compiling (one
    # graph for lengths chunks divide and the others) and the packed layout read once.
    # +243 (134 code, 109 docstring) for left-padded FLASH rows computed as they are alone (roll_rows,
    # row_alignment, the rows' phases in the cache, set by a row's first token, _start_rows, _continue_rows
    # and the decoding step per row), in place of warn_off_grid_padding: batched generate and pipelines gave
    # other tokens than one prompt at a time; gau_kernels.py +29, the remote modeling_gau.py (gau_cache.py
    # inlined) +214. +2 for the op's dropout range checked in eager only (a symbolic float in a checkpoint).
    # +4 for the attention dropout read from the config once, when the attention is built (a compiled,
    # checkpointed training step of a model of another dropout failed: EXPORTED_CODE_LINES).
    # +16 for widest_dtype in the shared file and one line in gau_kernels.py: packed FLASH's per-document
    # sums were float64, which MPS does not have (a TypeError there); float32 on MPS.
    # +7 for FlashInputs.cached_keys (EXPORTED_CODE_LINES says why).
    # +64 (32 code, 32 docstring) for the fields forward read from the config, read once when built instead:
    # GAUAttentionSettings (the unit's frozen copy the path and the reference take, and GAUFields), the
    # normalisations' own fields, the backbone's needs_key_counts and chunk_size; torch < 2.11's dynamo
    # guards no config attribute, so a second compiled model kept the first one's values.
    # Model inputs, an audit: +57 (41 code) in the shared file (EXPORTED_LINES says why).
    # The FLASH op, an audit: +77 (55 code) for float16 gradients of long causal rows (∂L/∂S_c read as
    # σ·(∂L/∂S_c / σ): Float16Summaries, chunk_summaries, the key kernel's SCALED branch and its per-chunk
    # scales; dk' and dv were ±inf), the op's arguments checked (causal a bool, one device, segments int64,
    # no open chunk for a bidirectional call) and the open chunk's padded keys masked.
    # +16 (3 code, 13 docstring) for summed_state in gau_kernels.py: a prefill of left-padded rows summed
    # its state from float32 copies of k' and v (issue 47: no float32 activations).
    # +3 in the shared file: head_dim checked even under RoPE (EXPORTED_CODE_LINES says why).
    "gau": 6890,
    # Above the 1,550 target: the shared file, as for the entropy-invariant family (issue 47's loss included).
    # Issue 50: +792 docstring lines for the documented arguments; lines less docstrings 1,895 → 1,887.
    # Issue 45, an audit of the Python API: +22 (17 code, 5 docstring) in the shared backbone for one
    # ValueError for a 1D or 3D attention_mask (the Synthesizer's positions ran a 3D one at batch 1 and gave
    # other logits than no mask) and for position_ids outside the learned absolute positions (an IndexError);
    # +3 for eos_token_id checked as pad and bos are (a string failed deep in generate).
    # Issue 45, a second audit: +15 (11 code, 4 docstring) for head indices checked as integers (is_index): a
    # pruned_heads of {0: [True]} pruned head 1, and 1.5 head 1 (int() took them); a bool tensor, a float
    # tensor or an array is refused in the same ValueError.
    # Issue 45, left by its audits: +11 code lines for fields of other families refused in one ValueError
    # instead of kept and ignored (AttnVariantConfig.not_applicable: no_rope_layers outside the
    # entropy-invariant family).
    # Issue 45, an audit of the integrations: +11 (6 code, 5 docstring) for pruned_heads under vLLM (as for
    # the entropy-invariant family) and the refusal's last sentence, now the family's own.
    # Issue 45, an audit of PreTrainedModel features and generation: +59 (29 code, 30 docstring) in the shared
    # file for the stock models' log-n attention names refused (get_correct_attn_implementation: Transformers
    # accepts any registered name, and this family squared the factor under attn_implementation=
    # "entropy_invariant"), continuous batching refused in one sentence (init_continuous_batching: every
    # request failed in the manager's thread), a causal config in a bidirectional head said once (logger),
    # nᵢ following the mask over given positions (visible_key_counts' docstring), and a pad_token_id past the
    # vocabulary refused by the config (torch's AssertionError deep in the embedding).
    # +4 code lines for a StaticCache longer than the patterns named by its max_cache_len; +5 for static-cache
    # decoding traced as one graph (the length check and the pattern rows read the cache's counter on the host
    # at every step: a graph break each, and fullgraph=True failed).
    # +5 (4 code) in the shared file for leading_padding, the count of leading padding the FLASH warning and
    # the Synthesizer's pattern rows share (each wrote it out).
    # +32 (15 code) in the shared file for the chunked loss's power-of-two chunk count (chunk_layout): a
    # compiled step with labels compiled again at every batch × length, and ran eagerly after eight.
    # +1 for the attention dropout read from the config once, when the attention is built (a compiled,
    # checkpointed training step of a model of another dropout failed: EXPORTED_CODE_LINES).
    # +14 for widest_dtype in the shared file: packed FLASH's per-document sums were float64,
    # which MPS does not have (a TypeError there); float32 on MPS.
    # +10 (5 code, 5 docstring) for the pattern length and the learned-position check read when built, not
    # from the config in forward (torch < 2.11's dynamo guards no config attribute).
    # Model inputs, an audit: +57 (41 code) in the shared file (EXPORTED_LINES says why), +12 (11 code) in
    # the config for the warning when the random patterns pass 2³⁰ parameters (l copied from a Llama config).
    # +3 in the shared file: head_dim checked even under RoPE (EXPORTED_CODE_LINES says why).
    "synthesizer": 3402,
}
EXPORTED_CODE_LINES = {
    # Issue 50: the same files' lines less their docstring lines, as measured on 2026-11-28 before that issue
    # (named head classes, the registration of the parallel styles and the documented arguments); they must
    # not grow when docstrings do, so EXPORTED_LINES above rises by docstring lines only.
    # Issue 45, an audit of the Python API: +17 in the shared backbone and +3 in the config, every family
    # (EXPORTED_LINES says why; the entropy-invariant family's 1,772 became 1,792, the Synthesizer's 1,887
    # became 1,907).
    # Issue 45, a second audit: +11 for head indices checked as integers (EXPORTED_LINES says why).
    # Issue 45, left by its audits: +12 for fields of other families refused (EXPORTED_LINES says why).
    # Issue 45, an audit of the integrations: +5 for pruned_heads refused under vLLM (EXPORTED_LINES).
    # Issue 45, an audit of PreTrainedModel features and generation: +29 in the shared file (EXPORTED_LINES).
    # +4 for leading_padding in the shared file (EXPORTED_LINES says why).
    # +15 for chunk_layout in the shared file (EXPORTED_LINES says why).
    # +1 for the attention dropout read from the config once, when the attention is built: a compiled,
    # checkpointed training step of a second model of another dropout failed (a symbolic float).
    # +4 for widest_dtype in the shared file: MPS has no float64 (EXPORTED_LINES).
    # +8 for the config fields read once when built, not in forward (EXPORTED_LINES says why).
    # Model inputs, an audit: +57 (41 code) in the shared file (EXPORTED_LINES says why).
    # +3 in the shared file: head_dim checked even under RoPE by the multi-head config (RotaryEmbedding
    # raised it when the model was built: lengthgen left a run.json behind a traceback).
    "entropy_invariant": 1925,
    # Issue 47, after the first compile for sm_90/sm_80 on CPU (scripts/triton_resources.py): +34 for each
    # kernel's launch options as data (FLASH_LAUNCH, flash_launch_options, relu2_launch_options), the key
    # kernel's transposed scores (_relu_scores_by_key) and the whole-chunk switch (_rows_of_chunk), which
    # took the FLASH kernels' register spills to 0; +2 for "auto" taking the Triton kernels for bf16/fp16
    # inputs only (use_triton_kernel's dtype); +11 for the float32 launch (FLASH_LAUNCH_FLOAT32,
    # flash_launch_table, the grids' dtype), whose smaller tiles compile faster and spill less.
    # Issue 47, a review of the op: +8 for the Triton implementation's final state carrying its gradient, as
    # the reference's and the chunked path's do (training across calls), and its one-sentence refusal of a
    # dropout it would ignore (+1 so that an unused state costs the backward nothing); +7 for dense_mask, so
    # that the quadratic kernels read a mask broadcast over rows or queries (a [1, 1, T, T] attention mask)
    # at stride 0 instead of past its end.
    # Issue 47, float16 at long context: +35 for the states past 2¹⁵ divided by a power of two before their
    # cast to float16 (state_scales, scales_states, state_product, the forward and query kernels' SCALED
    # branch and _state_scale): Σ k'ᵀv passes 65,504 at long context, and the numerator was NaN.
    # Issue 47: +42 for check_flash_arguments, one ValueError naming the argument the op cannot take, instead
    # of an out-of-bounds read or write in the Triton kernels for mismatched shapes (EXPORTED_LINES).
    # Issue 45: +17 for the shared backbone's checks of the mask's rank and of learned positions, +3 for
    # eos_token_id's check.
    # Issue 45, a second audit: +11 for head indices checked as integers (EXPORTED_LINES says why).
    # Issue 48: +30 for one dtype at the Triton kernels and float64 refused on a GPU (EXPORTED_LINES).
    # Issue 45, left by its audits: +12 for fields of other families refused (EXPORTED_LINES says why).
    # Issue 45, an audit of the integrations: +11 for pruned_heads under vLLM and gau_kernel='triton' on CPU
    # outside the interpreter refused (EXPORTED_LINES says why).
    # Issue 45, an audit of PreTrainedModel features and generation: +29 in the shared file (EXPORTED_LINES).
    # +27 in GAU's files for the left-padding warning and the refused cache of other rows.
    # +3 for leading_padding in the shared file less one line of modeling_gau.py (EXPORTED_LINES says why).
    # +15 for chunk_layout in the shared file, +4 for the query blocks' count (EXPORTED_LINES says why).
    # +71 for packed rows compiled in linear memory (flash_packed_windows; EXPORTED_LINES says why); +3 for
    # the loss's copy skipped, the chunks padded while compiling and the layout read once.
    # +134 for left-padded FLASH rows computed as they are alone (EXPORTED_LINES says why); +2 for the
    # op's dropout range checked in eager only.
    # +3 for the attention dropout read from the config once, when the attention is built: a compiled,
    # checkpointed training step of a second model of another dropout failed (a symbolic float).
    # +5 for widest_dtype in the shared file and one line in gau_kernels.py: MPS has no float64
    # (EXPORTED_LINES).
    # +2 for FlashInputs.cached_keys, the cache's [k ‖ k'·mask] written once for the decoding step and the
    # prefill of left-padded rows (each wrote it out).
    # +32 for the config fields read once when built, not in forward (EXPORTED_LINES says why).
    # Model inputs, an audit: +57 (41 code) in the shared file (EXPORTED_LINES says why).
    # The FLASH op, an audit: +55 (EXPORTED_LINES says why).
    # +3 for summed_state: a prefill of left-padded rows summed its state from float32 copies of k' and v
    # (issue 47: no float32 activations); each chunk's product in the model dtype now, as the op's own.
    # +3 in the shared file: head_dim checked even under RoPE by the multi-head config (RotaryEmbedding
    # raised it when the model was built: lengthgen left a run.json behind a traceback).
    "gau": 3958,
    # Issue 45, a second audit: +11 for head indices checked as integers (EXPORTED_LINES says why).
    # Issue 45, left by its audits: +11 for fields of other families refused (EXPORTED_LINES says why).
    # Issue 45, an audit of the integrations: +6 (EXPORTED_LINES says why).
    # Issue 45, an audit of PreTrainedModel features and generation: +29 in the shared file (EXPORTED_LINES).
    # +4 for the StaticCache's max_cache_len named; +5 for static-cache decoding traced as one graph.
    # +4 for leading_padding in the shared file (EXPORTED_LINES says why).
    # +15 for chunk_layout in the shared file (EXPORTED_LINES says why).
    # +1 for the attention dropout read from the config once, when the attention is built: a compiled,
    # checkpointed training step of a second model of another dropout failed (a symbolic float).
    # +4 for widest_dtype in the shared file: MPS has no float64 (EXPORTED_LINES).
    # +5 for the config fields read once when built, not in forward (EXPORTED_LINES says why).
    # Model inputs, an audit: +57 (41 code) in the shared file (EXPORTED_LINES says why), +12 (11 code) in
    # the config for the warning when the random patterns pass 2³⁰ parameters (l copied from a Llama config).
    # +3 in the shared file: head_dim checked even under RoPE by the multi-head config (RotaryEmbedding
    # raised it when the model was built: lengthgen left a run.json behind a traceback).
    "synthesizer": 2057,
}
FAMILY_FILE_LINES = {
    "entropy_invariant": 700,
    # Issue 50: 875 → 1,379 lines, +484 of them docstring lines (documented arguments) and +20 the five named
    # head classes that replaced the shared head factory; the file's lines less docstrings are 731.
    # Issue 47: +5 for "auto" taking the Triton kernels for bf16/fp16 inputs only (the dtype argument).
    # Issue 48: +9 for compiling FLASH on torch 2.7–2.8 (FlashInputs.tensors; EXPORTED_LINES says why).
    # Issue 45: +1 for the refusal under vLLM's Transformers backend naming model_impl and the wheel.
    # Issue 45, an audit of generation: +47 for the left-padding warning and the refused cache of other rows.
    # +14 for the flash_windows path (packed rows compiled without the n × n reference).
    # +214 for left-padded rows computed as they are alone (EXPORTED_LINES says why), gau_cache.py included.
    # +4 for the attention dropout read once when built (EXPORTED_LINES says why).
    # +7 for FlashInputs.cached_keys (EXPORTED_CODE_LINES says why).
    # +63 for GAUAttentionSettings and the other config fields read once when built (EXPORTED_LINES says why).
    "gau": 1744,
    "synthesizer": 700,
}
WINDOW = 6
DUPLICATE_PAIRS = 8
FUNCTION_LINES = 80


def line_count(text: str) -> int:
    return text.count("\n")


def docstring_lines(text: str) -> int:
    """Lines of ``text`` that belong to docstrings (module, class, function and attribute docstrings)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        value = getattr(node, "value", None)
        if isinstance(node, ast.Expr) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return len(lines)


def source_files(root: Path) -> list[Path]:
    """The Python files of ``root`` that are package source (not the committed remote code)."""
    return sorted(path for path in root.rglob("*.py") if REMOTE not in path.parents)


@pytest.mark.parametrize("family", list(EXPORTED_LINES))
def test_exported_remote_code_stays_within_its_limits(family: str) -> None:
    files = exported_files(f"configuration_{family}", f"modeling_{family}")
    sizes = {name: line_count(bundle.text) for name, bundle in files.items()}
    code = sum(sizes.values()) - sum(docstring_lines(bundle.text) for bundle in files.values())
    assert code <= EXPORTED_CODE_LINES[family], (family, code)
    assert sum(sizes.values()) <= EXPORTED_LINES[family], (family, sizes)
    assert sizes[f"modeling_{family}"] <= FAMILY_FILE_LINES[family], (family, sizes)


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the statement lines: no blank lines, comments, docstrings or imports
    (an import list or a sentence says nothing about repeated logic)."""
    source = path.read_text(encoding="utf-8")
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        value = getattr(node, "value", None)
        docstring = (isinstance(node, ast.Expr) and isinstance(value, ast.Constant)
                     and isinstance(value.value, str))
        if docstring or isinstance(node, (ast.Import, ast.ImportFrom)):
            skipped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [(number, line.strip()) for number, line in enumerate(source.splitlines(), 1)
            if number not in skipped and line.strip() and not line.strip().startswith("#")]


def duplicate_runs(root: Path, window: int = WINDOW, most_places: int = 8) -> list[str]:
    """Runs of at least ``window`` identical statement lines that stand in two places of ``root``'s Python
    files, one entry per pair of places (``a.py:10 ~ b.py:40``); a window standing in more than
    ``most_places`` places is too common to count (boilerplate)."""
    index: dict[str, list[tuple[str, int]]] = defaultdict(list)
    numbers: dict[str, list[int]] = {}
    for path in source_files(root):
        name = str(path.relative_to(root))
        lines = code_lines(path)
        numbers[name] = [number for number, _ in lines]
        for start in range(len(lines) - window + 1):
            chunk = "\n".join(text for _, text in lines[start:start + window])
            index[hashlib.sha1(chunk.encode()).hexdigest()].append((name, start))
    matches: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for places in index.values():
        if len(places) <= most_places:
            for (file_a, a), (file_b, b) in itertools.combinations(places, 2):
                matches[(file_a, file_b)].add((a, b))
    return [f"{file_a}:{numbers[file_a][a]} ~ {file_b}:{numbers[file_b][b]}"
            for (file_a, file_b), starts in sorted(matches.items()) for a, b in sorted(starts)
            if (a - 1, b - 1) not in starts]


def test_repeated_code_in_src_stays_within_its_limit() -> None:
    runs = duplicate_runs(SRC)
    assert len(runs) <= DUPLICATE_PAIRS, runs


def test_the_repeat_finder_finds_a_copied_function(tmp_path) -> None:
    body = "".join(f"    x{i} = x{i - 1} + {i}\n" for i in range(1, 8))
    (tmp_path / "a.py").write_text(f"def f(x0):\n{body}    return x7\n")
    (tmp_path / "b.py").write_text(f'"""Doc."""\nimport os\n\n\ndef g(x0):\n{body}    return os.sep\n')
    assert duplicate_runs(tmp_path) == ["a.py:2 ~ b.py:6"]


def test_no_function_in_src_is_longer_than_the_limit() -> None:
    long = []
    for path in source_files(SRC):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
