"""What a suite is: its parameters, where its files live, its models and tokenizers, and
how a problem becomes a prompt.

  params       the suite's YAML files, validated against a schema
  paths        every path the book reads or writes
  models       the model registry: where each model comes from, how it loads, its identity
  gguf_cache   a GGUF model converted once to a local safetensors copy
  tokenizers   what two models must share to be compared token by token
  prompting    the chat prompt of a problem
  discover     a trainer's run folder -> a suite (run_layouts, trainer_layouts, run_checks,
               run_convert with convert_fsdp and convert_states, suite_writer)
"""
