"""Helpers shared by the Hugging Face conversion tests and their rank workers: read a
checkpoint's tensors, import it at TP=1, and write a copy with a tensor dropped or added."""
import json
import os
import pathlib

import torch
from safetensors.torch import load_file, save_file


def hf_tensors(d) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in a checkpoint directory."""
    return {k: v for f in sorted(os.listdir(d)) if f.endswith(".safetensors")
            for k, v in load_file(os.path.join(d, f)).items()}


def import_hf(hf_dir):
    """-> (GPTModel at TP=1 with the checkpoint loaded, its shape, the loaded parameter names)."""
    from tandem.convert.hf_load import load_hf_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.registry import shape_from_hf_config

    shape = shape_from_hf_config(json.loads((pathlib.Path(hf_dir) / "config.json").read_text()))
    model = build_gpt_model(shape)
    loaded = load_hf_weights(model, str(hf_dir), shape, tp_rank=0, tp_size=1)
    return model, shape, loaded


def copy_with(src, dst, drop=None, add=None):
    """A copy of checkpoint `src` in `dst` without tensor `drop` and/or with an extra tensor `add`."""
    t = hf_tensors(src)
    if drop:
        del t[drop]
    if add:
        t[add] = torch.zeros(3)
    dst.mkdir()
    save_file(t, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def split_files(src, dst, files: int, twice: str | None = None):
    """A copy of checkpoint `src` in `dst` over `files` safetensors files, its keys dealt round-robin in
    sorted order (so a layer's q/k/v and gate/up parts land in different files); `twice`: a key also
    written to the next file."""
    t = hf_tensors(src)
    shards = [{} for _ in range(files)]
    for i, k in enumerate(sorted(t)):
        shards[i % files][k] = t[k]
        if k == twice:
            shards[(i + 1) % files][k] = t[k]
    dst.mkdir()
    for i, shard in enumerate(shards):
        save_file(shard, str(dst / f"model-{i + 1:05d}-of-{files:05d}.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst
