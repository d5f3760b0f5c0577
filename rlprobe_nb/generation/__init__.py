"""Chapters 01 and 02: seeded sampling of answers and rollouts, token ids kept.

  sampling           counter-based Gumbel-max: a draw depends on seed, step and logits only
  slot_cache         per-slot key/value buffers of the decode loop
  fused_projections  q/k/v and gate/up projections as one product each (CUDA)
  decoding           the decode loop: slots refilled as sequences end, CUDA graphs
  rollouts           answers and rollouts tables, graded, with failure types
"""
