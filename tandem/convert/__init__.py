"""Hugging Face checkpoints <-> megatron-core models: the file I/O and the TP/EP gathers.

What a family's config.json and weight names are is tandem/models' (registry.py, families/,
mapping.py); this package reads and writes the files and moves the shards:

- hf_load:   stream safetensors into this rank's shards, strictly;
- hf_export: gather TP (and EP) shards and write model.safetensors + config.json;
- reshard:   the training layout -> TP=1 weights for a generation engine (bucketed all-gathers).
"""
