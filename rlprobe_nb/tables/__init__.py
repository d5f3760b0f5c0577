"""How results are kept: one schema per table, parquet parts written atomically with a
manifest, verified on read, keyed by everything their rows depend on.

  schemas       one schema per table, defined once
  storage       tables on disk: parts, manifests, resume, verified reads
  parts         the hidden working folder; what ties a part to its table
  atomic        files written atomically
  tensor_files  tensors in safetensors files (hidden-state caches)
  locks         one writer at a time per folder
  keys          key hashes and their differences in words
  lineage       what each table's key is, and whether a table is current
  provenance    what every manifest records
  suite_tables  the per-token tables of a suite, checked current
  clean         delete what the book wrote for a suite
"""
