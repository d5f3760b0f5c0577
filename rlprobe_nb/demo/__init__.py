"""What only the embedded demo suite needs; nothing outside this folder imports it.

  grpo           the miniature RLVR run: GRPO with a verifiable reward, LoRA
  training_run   the recorded training run shipped with the suite: tables and charts
  tiny           tiny stand-in tokenizer and models for tests and CPU dry runs
"""
