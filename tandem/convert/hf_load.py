"""Stream a Hugging Face safetensors checkpoint into this rank's megatron shards.

Strict (nanoGPT's from_pretrained / vLLM's load_weights): any HF key the table does not know,
any HF key it expects but the checkpoint lacks, and any megatron parameter left unloaded raise
ValueError naming them. The checkpoint's files are read in parallel, one reader thread per file
(up to READERS; safetensors maps the files, so the reads happen in torch's copies and checks,
which release the GIL), each tensor straight onto the parameters' device (safe_open(device=...):
on a GPU nothing is staged in host memory by us, and the NaN/inf check runs there). The parts of a fused mapping (q/k/v, gate/up) may
sit in different files: they are held, under the load's lock, only until the last part arrives.

The name table is the checkpoint's family's (config.json's architecture, tandem/models/registry.py).
Skipped on purpose: rotary `inv_freq` buffers (recomputed) and, for tied embeddings, an
`lm_head.weight` some checkpoints store anyway (megatron reuses the embedding).
MoE (Qwen3-MoE): each expert-parallel rank loads only its experts (its table lists only those),
split over the expert-tensor-parallel group; the other ranks' expert keys are skipped, not
unexpected.
Pipeline parallelism (dense models): each stage loads its own layers (the table's global layer
numbers become the stage's local ones), the embedding on the first stage, the final norm and output
layer on the last, whose copy of a tied embedding is loaded from the embedding's HF key; the other
stages' keys are skipped, not unexpected.
A tensor with NaN or inf is refused, naming the file and the key.
Vocab: the HF vocab must be divisible by tp (megatron's vocab-parallel layers assume it);
otherwise loading is refused with the numbers -- no silent row padding.
Not handled: a mixture-of-experts model at pp > 1, scalar-head (critic) models.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from tandem.convert.reshard import expert_ranks
from tandem.models.registry import architecture_of, read_hf_config, weight_mappings

# HF keys found in some checkpoints that carry no weights (recomputed buffers): skipped on load.
IGNORED_HF = (re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"),)
LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.*)")
# reader threads at most: past a few, one local disk (or page cache) is the limit, and each holds a tensor
READERS = 8


def hf_safetensors_files(hf_dir: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors files in {hf_dir}")
    return files


def _check_parallel(model, shape, tp_size: int) -> None:
    if model.config.pipeline_model_parallel_size > 1 and shape.moe is not None:
        raise ValueError("HF import of a mixture-of-experts model at pipeline_model_parallel_size > 1 is not offered")
    if shape.vocab_size % tp_size:
        raise ValueError(f"vocab_size={shape.vocab_size} is not divisible by tp={tp_size}; "
                         "pad the vocabulary of the HF checkpoint (embed_tokens and lm_head rows) "
                         "to a multiple of tp first")


def _stage_mappings(model, mappings: list) -> tuple[list, set[str]]:
    """(this pipeline stage's mappings, megatron names local to it; the other stages' HF keys)."""
    if model.config.pipeline_model_parallel_size == 1:
        return mappings, set()
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    offset, layers = get_transformer_layer_offset(model.config), len(model.decoder.layers)
    params = dict(model.named_parameters())
    mine, theirs = [], set()
    for m in mappings:
        layer = LAYER.fullmatch(m.megatron)
        if layer is None and m.megatron in params:
            mine.append(m)
        elif layer is not None and offset <= int(layer.group(1)) < offset + layers:
            mine.append(dataclasses.replace(m, megatron=f"decoder.layers.{int(layer.group(1)) - offset}.{layer.group(2)}"))
        else:
            theirs.update(m.hf_names)
    if "output_layer.weight" in params and not any(m.megatron == "output_layer.weight" for m in mine):
        embedding = next(m for m in mappings if m.megatron == "embedding.word_embeddings.weight")
        mine.append(dataclasses.replace(embedding, megatron="output_layer.weight"))  # the last stage's tied copy
    return mine, theirs - {name for m in mine for name in m.hf_names}


def _other_ranks_hf_names(shape, architecture: str, ep_rank: int, ep_size: int) -> set[str]:
    """HF keys in the tables of the other expert-parallel ranks (their experts)."""
    return {name for r in range(ep_size) if r != ep_rank
            for m in weight_mappings(shape, r, ep_size, architecture) for name in m.hf_names}


@dataclasses.dataclass
class _Load:
    """One load's table and what its reader threads have seen so far (shared, under `lock`)."""
    hf_dir: str
    tie_word_embeddings: bool
    by_hf: dict  # HF key -> its mapping
    elsewhere: set[str]  # HF keys of other stages / expert ranks: seen, not loaded
    params: dict[str, torch.Tensor]
    ranks: dict[str, tuple[int, int]]  # mapping group ("tp", "etp") -> (rank, size)
    device: torch.device
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    failed: threading.Event = dataclasses.field(default_factory=threading.Event)  # readers stop early
    pending: dict[str, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)  # megatron -> parts
    seen_hf: set[str] = dataclasses.field(default_factory=set)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    loaded: set[str] = dataclasses.field(default_factory=set)

    def read_file(self, path: str) -> None:
        from safetensors import safe_open

        try:
            with safe_open(path, framework="pt", device=str(self.device)) as f:
                for key in f.keys():
                    if self.failed.is_set():
                        return
                    m = self._claim(key)
                    if m is None:
                        continue
                    tensor = f.get_tensor(key)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        raise ValueError(f"{path}: tensor {key!r} contains NaN or inf")
                    with self.lock:
                        parts = self.pending.setdefault(m.megatron, {})
                        parts[key] = tensor
                        if len(parts) < len(m.hf_names):
                            continue
                        del self.pending[m.megatron]
                    self._copy(m, parts)  # outside the lock: each parameter has one mapping
        except BaseException:
            self.failed.set()
            raise

    def _claim(self, key: str):
        """The mapping `key` feeds, or None for a key skipped, elsewhere or unexpected."""
        if any(p.fullmatch(key) for p in IGNORED_HF):
            return None
        if key == "lm_head.weight" and self.tie_word_embeddings:
            return None
        with self.lock:
            if key in self.elsewhere:
                self.seen_hf.add(key)
                return None
            m = self.by_hf.get(key)
            if m is None:
                self.unexpected.append(key)
                return None
            if key in self.seen_hf:
                raise ValueError(f"HF key {key!r} appears twice in {self.hf_dir}")
            self.seen_hf.add(key)
        return m

    def _copy(self, m, parts: dict[str, torch.Tensor]) -> None:
        param = self.params[m.megatron]
        rank, size = self.ranks["etp" if m.group == "etp" else "tp"]
        shard = m.shard(parts, rank, size)
        if shard.shape != param.shape:
            raise ValueError(f"{m.megatron}: HF {list(m.hf_names)} give shape {tuple(shard.shape)} "
                             f"at {m.group}_rank={rank}/{size}, the model has {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(shard)
        with self.lock:
            self.loaded.add(m.megatron)


def load_hf_weights(model, hf_dir: str, shape, tp_rank: int, tp_size: int, readers: int | None = None) -> set[str]:
    """Copy the HF checkpoint in `hf_dir` into `model` (this TP rank's shards).

    Returns the set of megatron parameter names loaded (all of them, or it raises).
    Expert-parallel ranks come from megatron's parallel_state. readers: reader threads (default
    min(files, READERS); bench/model_build.py --load compares with one).
    """
    _check_parallel(model, shape, tp_size)
    ep_rank, ep_size, etp_rank, etp_size = expert_ranks()
    architecture = architecture_of(read_hf_config(hf_dir))
    mappings, other_stages = _stage_mappings(model, weight_mappings(shape, ep_rank, ep_size, architecture))
    by_hf = {name: m for m in mappings for name in m.hf_names}
    elsewhere = (_other_ranks_hf_names(shape, architecture, ep_rank, ep_size) | other_stages) - set(by_hf)
    params = dict(model.named_parameters())
    unknown_megatron = sorted(m.megatron for m in mappings if m.megatron not in params)
    if unknown_megatron:
        raise ValueError(f"megatron model has no parameters {unknown_megatron}")

    files = hf_safetensors_files(hf_dir)
    load = _Load(hf_dir, shape.tie_word_embeddings, by_hf, elsewhere, params,
                 {"tp": (tp_rank, tp_size), "etp": (etp_rank, etp_size)}, next(iter(params.values())).device)
    with ThreadPoolExecutor(min(len(files), readers or READERS), thread_name_prefix="hf-load") as pool:
        futures = [pool.submit(load.read_file, path) for path in files]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:  # the first file's in file order (one reader: the sequential read's first error)
        raise errors[0]
    if load.unexpected:
        raise ValueError(f"unexpected HF keys in {hf_dir}: {sorted(load.unexpected)}")
    missing_hf = sorted((set(by_hf) | elsewhere) - load.seen_hf)
    if missing_hf:
        raise ValueError(f"HF keys missing from {hf_dir}: {missing_hf}")
    unloaded = sorted(set(params) - load.loaded)
    if unloaded:
        raise ValueError(f"megatron parameters not loaded from {hf_dir}: {unloaded}")
    return load.loaded
