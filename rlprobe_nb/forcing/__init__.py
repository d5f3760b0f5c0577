"""Teacher forcing: push the reference's rollouts through models, once per model, and
write the exact per-token divergence table of every compared pair.

The notebook's calls::

    seqs = forcing.build_sequences(rollouts, problems, tokenizer, template,
                                   max_context=forcing.model_context(model))
    ckpt = forcing.Side("rlvr_step_1200", model=lm.model, tokenizer=lm.tokenizer,
                        cache_dir=forcing.hidden_dir(suite, "rlvr_step_1200", identity))
    ref = forcing.Side("dpo", cache_dir=forcing.hidden_dir(suite, "dpo", ref_identity))
    out = forcing.run_pair(seqs, ckpt, ref, forcing.pair_dir(suite, ckpt.name, ref.name),
                           suite=suite, batch_tokens=..., chunk_positions=..., topk=5,
                           device="cuda", provenance=manifest_dict, key=inputs)

One idea per module:
  sequences      forced sequences and the alignment contract (row k predicts token k)
  spans          each response token's text and character span
  batching       length-bucketed batches and their padded inputs
  body           the model body: forward to final hidden states, compiled layers
  heads          LM heads with float32 output, chunked metrics of a pair
  transfer       host <-> device copies that overlap the compute
  hidden_cache   the per-model hidden-state cache
  token_table    one batch of the per-token table in Arrow
  engine         the device loop: run_pair and its named steps

Numerics. The model body (decoder + final norm) runs in the model's dtype; the LM head is
applied to chunks of ``chunk_positions`` positions with float32 output, restricted to the
tokenizer's real vocabulary (a model that puts probability on padded head rows is
refused); ``divergence.token_metrics`` does the math. No [tokens x vocab] tensor is ever
held whole.

Refusals, all before the first forward: tokenizers differ (including a cache made with
another tokenizer or model), a response longer than the context (policy "skip", counted
in the manifest, or "error"), a rollout id that does not exist, duplicate rollout ids, an
empty response, a side whose cache does not exist or lacks rollouts, a prompt that does not
match the one the rollout was sampled from, a table or cache computed from other inputs.
"""

from rlprobe_nb.forcing.batching import Batch, batch_inputs, plan_batches
from rlprobe_nb.forcing.body import (
    compile_layers,
    decoder_of,
    forward_hidden,
    layers_compiled,
    model_context,
)
from rlprobe_nb.forcing.engine import (
    Share,
    Side,
    compare_cached,
    forward_to_cache,
    hidden_dir,
    pair_dir,
    pending,
    run_checkpoint,
    run_pair,
    table_key,
)
from rlprobe_nb.forcing.heads import (
    METRIC_COLUMNS,
    PADDED_MASS_TOLERANCE,
    LMHead,
    check_padded_mass,
    head_logits,
    head_method,
    lm_head_of,
    pair_metrics,
)
from rlprobe_nb.forcing.hidden_cache import HiddenCache
from rlprobe_nb.forcing.sequences import (
    CONTEXT_POLICIES,
    TOKEN_METHODS,
    ForcedSequence,
    SequenceSet,
    build_sequences,
    make_sequence,
)
from rlprobe_nb.forcing.spans import token_spans
from rlprobe_nb.forcing.token_table import UNIQUE, rows_table
from rlprobe_nb.forcing.transfer import DeviceCopy, HostCopy, host_slices

__all__ = [
    "Batch", "batch_inputs", "plan_batches", "compile_layers", "decoder_of", "forward_hidden",
    "layers_compiled", "model_context", "Share", "Side", "compare_cached", "pending", "forward_to_cache",
    "hidden_dir", "pair_dir", "run_checkpoint", "run_pair", "table_key", "METRIC_COLUMNS",
    "PADDED_MASS_TOLERANCE", "LMHead", "check_padded_mass", "head_logits", "head_method",
    "lm_head_of", "pair_metrics", "HiddenCache", "CONTEXT_POLICIES", "TOKEN_METHODS",
    "ForcedSequence", "SequenceSet", "build_sequences", "make_sequence", "token_spans",
    "UNIQUE", "rows_table", "DeviceCopy", "HostCopy", "host_slices",
]
