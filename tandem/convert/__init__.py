"""Hugging Face <-> megatron-core weight conversion (Llama / Qwen2 families, Qwen3-MoE).

- hf_config: HF config.json <-> ModelShape (refuses what the megatron spec cannot express);
- mapping:   the name table and the typed mappings (Direct / QKV / GatedMLP) that know
             qkv interleaving, gate/up fusion and TP slicing;
- hf_load:   stream safetensors into this rank's shards, strictly;
- hf_export: gather TP shards and write model.safetensors + config.json;
- moe_config / moe_mapping: Qwen3-MoE's config fields and name table (router, per-expert
             gate/up -> linear_fc1, down -> linear_fc2, q/k norms; experts split over EP ranks).
"""
